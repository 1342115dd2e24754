//! Bearer tokens: the control token (needed to change anything) and the
//! optional read token, compared in constant time.

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
                "control is disabled: start the agent with --control-token-file to enable it",
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

/// Whether the request's bearer token equals one of `want` (constant time
/// in the token's content; every candidate is compared).
fn token_matches<B>(req: &Request<B>, want: [Option<&String>; 2]) -> bool {
    use subtle::ConstantTimeEq;
    let got = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
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
}
