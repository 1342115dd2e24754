//! Bearer tokens: the control token (needed to change anything) and the
//! optional read token, compared in constant time. The `Bearer` scheme is
//! matched in any case, as RFC 9110 requires.

use hyper::header::HeaderValue;
use hyper::{Request, StatusCode};

use super::body::{Resp, error};

/// The tokens a server checks.
#[derive(Debug, Default, Clone)]
pub struct Tokens {
    /// Bearer token of the control endpoints (none: control refused, 403).
    pub control: Option<String>,
    /// Bearer token that reads must present (none: reads are open).
    pub read: Option<String>,
}

impl Tokens {
    /// Checks the control bearer token: `Err` is the refusal to send.
    pub fn authorize<B>(&self, req: &Request<B>) -> Result<(), Box<Resp>> {
        let Some(want) = &self.control else {
            return Err(Box::new(error(
                StatusCode::FORBIDDEN,
                "control is disabled: the agent started without a control token (no --control-token-file, or its file did not exist then; in Kubernetes, the pfs-agent-control-token Secret): create the file and restart the agent",
            )));
        };
        if token_matches(req, [Some(want), None]) {
            Ok(())
        } else {
            Err(Box::new(unauthorized()))
        }
    }

    /// Checks the read token, if one is configured (the control token is
    /// accepted too).
    pub fn authorize_read<B>(&self, req: &Request<B>) -> Result<(), Box<Resp>> {
        let Some(read) = &self.read else {
            return Ok(());
        };
        if token_matches(req, [Some(read), self.control.as_ref()]) {
            Ok(())
        } else {
            Err(Box::new(unauthorized()))
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header value. The
/// scheme is case-insensitive (RFC 9110 §11.1: `bearer`, `BEARER`), and one
/// or more spaces may separate it from the token.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("Bearer") && !token.is_empty()).then_some(token)
}

/// Whether the request's bearer token equals one of `want` (constant time
/// in the token's content; every candidate is compared).
fn token_matches<B>(req: &Request<B>, want: [Option<&String>; 2]) -> bool {
    use subtle::ConstantTimeEq;
    let got = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .unwrap_or("");
    let mut ok = subtle::Choice::from(0);
    for w in want.into_iter().flatten() {
        ok |= got.as_bytes().ct_eq(w.as_bytes());
    }
    bool::from(ok)
}

fn unauthorized() -> Resp {
    let mut r = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    r.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(auth: Option<&str>) -> Request<()> {
        let mut b = Request::builder();
        if let Some(a) = auth {
            b = b.header(hyper::header::AUTHORIZATION, a);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn tokens_decide() {
        let none = Tokens::default();
        assert!(none.authorize_read(&req(None)).is_ok(), "reads open");
        assert_eq!(
            none.authorize(&req(Some("Bearer x"))).unwrap_err().status(),
            StatusCode::FORBIDDEN,
            "control disabled without a token"
        );
        let t = Tokens {
            control: Some("c".into()),
            read: Some("r".into()),
        };
        assert!(t.authorize(&req(Some("Bearer c"))).is_ok());
        let refused = t.authorize(&req(Some("Bearer r"))).unwrap_err();
        assert_eq!(
            refused.status(),
            StatusCode::UNAUTHORIZED,
            "read token never controls"
        );
        assert!(
            refused
                .headers()
                .contains_key(hyper::header::WWW_AUTHENTICATE)
        );
        assert!(t.authorize_read(&req(Some("Bearer r"))).is_ok());
        assert!(t.authorize_read(&req(Some("Bearer c"))).is_ok());
        assert!(t.authorize_read(&req(Some("Bearer cc"))).is_err());
        assert!(t.authorize_read(&req(None)).is_err());
    }

    #[test]
    fn the_scheme_is_case_insensitive() {
        let t = Tokens {
            control: Some("c".into()),
            read: Some("r".into()),
        };
        for auth in ["Bearer c", "bearer c", "BEARER c", "bEaReR c", "Bearer  c"] {
            assert!(t.authorize(&req(Some(auth))).is_ok(), "{auth}");
            assert!(t.authorize_read(&req(Some(auth))).is_ok(), "{auth}");
        }
        for auth in ["Basic c", "Bearerc", "Bearer", "Bearer ", "c", "Bearer c c"] {
            assert!(t.authorize(&req(Some(auth))).is_err(), "{auth}");
        }
        assert_eq!(bearer_token("bearer tok"), Some("tok"));
        assert_eq!(bearer_token("Token tok"), None);
    }
}
