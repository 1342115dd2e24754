//! The connections being served, as the accept loop sees them: which
//! slot each holds, whether a response is in flight on it, since when it
//! has been idle, and which one closes to make room when every slot is
//! taken. Below [`super`] (the accept loop); uses only [`super::body`].
//!
//! A connection is *idle* while no response is in flight on it: from its
//! accept until its first request head arrives, and from the moment hyper
//! drops a response's body (handed whole to the connection's write
//! buffer: a client slow to read may not have it all yet) until the next
//! head. One closed after a request gets its last response flushed first
//! (within [`super::CLOSE_GRACE`]). With every regular and spare slot
//! taken, the connection idle the longest, if idle for at least
//! [`IDLE_FOR`], is told to close ([`Conns::evict_longest_idle`]): a flood
//! of silent connections (each would hold a slot until its header
//! timeout), or of keep-alive ones left open between requests, then never
//! keeps a probe or a scrape out. One with a response in flight is never
//! chosen.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::body::Body;

/// How long a connection must have been idle before it may be closed to
/// make room: a client sends its request as soon as it is connected
/// (within a round trip), so a burst of real clients beyond the slots
/// waits for one (as in the listen backlog) instead of closing each
/// other's connections. Short, so that a probe behind a flood of silent
/// ones is still answered well within its timeout.
pub const IDLE_FOR: Duration = Duration::from_millis(250);

/// How often a connection waiting for a slot looks again for an idle one
/// to close (the idle ones age meanwhile).
pub const EVICT_RETRY: Duration = Duration::from_millis(50);

/// The slot a connection holds: one of `max_connections`, or one of the
/// [`super::SPARE_CONNECTIONS`] accepted beyond them (which answers
/// `/healthz` at once and makes any other request wait for a regular
/// slot).
pub struct Slot {
    /// A regular slot, once it has one.
    pub regular: Option<tokio::sync::OwnedSemaphorePermit>,
    /// A spare slot, until it has a regular one.
    pub spare: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// One connection being served.
#[derive(Debug)]
pub struct Conn {
    /// When it was accepted.
    accepted: Instant,
    /// Request heads dispatched on it.
    requests: AtomicU64,
    /// Responses in flight on it: from the dispatch of a request head
    /// until hyper drops its response's body (handed whole to the
    /// connection's write buffer, or given up).
    in_flight: AtomicU64,
    /// When it last turned idle, in nanoseconds after `accepted`.
    idle_since: AtomicU64,
    /// It holds a regular slot (not only a spare one).
    regular: AtomicBool,
    /// Ended, or told to end.
    done: AtomicBool,
    /// Tells its task to close it.
    evict: tokio::sync::Notify,
}

impl Conn {
    /// Whether a request head was ever dispatched on it: closing it
    /// then lets hyper flush what it holds of the last response first.
    pub fn had_requests(&self) -> bool {
        self.requests.load(Ordering::Relaxed) != 0
    }

    /// Whether a response is in flight on it now.
    pub fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) != 0
    }

    /// How long it has been idle at `now` (`None`: it is not).
    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.busy() {
            return None;
        }
        let since = self.accepted + Duration::from_nanos(self.idle_since.load(Ordering::Relaxed));
        Some(now.saturating_duration_since(since))
    }

    /// Notes that it now holds a regular slot.
    pub fn holds_regular(&self) {
        self.regular.store(true, Ordering::Relaxed);
    }

    /// Notes that its task is ending.
    pub fn ended(&self) {
        self.done.store(true, Ordering::Relaxed);
    }

    /// Completes when it is told to close to make room.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }

    /// A request head was dispatched on it: in flight until the returned
    /// guard drops (wrap the response's body in it: [`Counted`]).
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }
}

/// A response in flight on a connection; dropped, the connection turns
/// idle (unless another is in flight).
#[derive(Debug)]
pub struct InFlight(Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let c = &self.0;
        let now = u64::try_from(c.accepted.elapsed().as_nanos()).unwrap_or(u64::MAX);
        c.idle_since.store(now, Ordering::Relaxed);
        // Release: whoever sees it idle sees since when.
        c.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection busy until it is dropped
/// (hyper drops it once written whole, or when the connection ends).
#[derive(Debug)]
pub struct Counted {
    body: Body,
    _in_flight: InFlight,
}

impl Counted {
    /// `body`, in flight until it drops.
    pub fn new(body: Body, in_flight: InFlight) -> Self {
        Self {
            body,
            _in_flight: in_flight,
        }
    }
}

impl hyper::body::Body for Counted {
    type Data = <Body as hyper::body::Body>::Data;
    type Error = <Body as hyper::body::Body>::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The connections being served, oldest first.
#[derive(Debug, Default)]
pub struct Conns(std::sync::Mutex<VecDeque<Arc<Conn>>>);

impl Conns {
    /// A new connection, last (the ended ones are forgotten now), holding
    /// `slot`; idle until its first request.
    pub fn add(&self, slot: &Slot) -> Arc<Conn> {
        self.add_at(slot, Instant::now())
    }

    /// [`Conns::add`], accepted at `accepted`.
    fn add_at(&self, slot: &Slot, accepted: Instant) -> Arc<Conn> {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        q.retain(|c| !c.done.load(Ordering::Relaxed));
        let c = Arc::new(Conn {
            accepted,
            requests: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            regular: AtomicBool::new(slot.regular.is_some()),
            done: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
        });
        q.push_back(c.clone());
        c
    }

    /// Tells the connection idle the longest, if for at least
    /// [`IDLE_FOR`] (and holding a regular slot, if `regular`), to close:
    /// its slot comes back when its task ends. Whether there was one.
    pub fn evict_longest_idle(&self, regular: bool) -> bool {
        let q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let longest = q
            .iter()
            .filter(|c| {
                !c.done.load(Ordering::Relaxed) && (!regular || c.regular.load(Ordering::Relaxed))
            })
            .filter_map(|c| Some((c.idle_for(now)?, c)))
            .filter(|(idle, _)| *idle >= IDLE_FOR)
            .max_by_key(|(idle, _)| *idle);
        let Some((_, c)) = longest else {
            return false;
        };
        c.done.store(true, Ordering::Relaxed);
        c.evict.notify_one();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot() -> Slot {
        Slot {
            regular: None,
            spare: None,
        }
    }

    /// A connection accepted a minute ago, idle since then.
    fn add(conns: &Conns) -> Arc<Conn> {
        conns.add_at(&slot(), Instant::now() - Duration::from_secs(60))
    }

    fn age(c: &Conn, by: Duration) {
        // Turned idle `by` earlier than now.
        let at = c.accepted.elapsed().saturating_sub(by);
        c.idle_since.store(at.as_nanos() as u64, Ordering::Relaxed);
    }

    #[test]
    fn the_longest_idle_connection_is_chosen_never_a_busy_one() {
        let conns = Conns::default();
        let (a, b, c) = (add(&conns), add(&conns), add(&conns));
        for c in [&a, &b, &c] {
            age(c, Duration::ZERO);
        }
        // Nobody idle long enough yet.
        assert!(!conns.evict_longest_idle(false));
        // a: busy for long; b: idle 1 s after a request; c: idle 2 s.
        let _busy = a.start();
        age(&a, Duration::from_secs(10));
        drop(b.start());
        age(&b, Duration::from_secs(1));
        age(&c, Duration::from_secs(2));
        assert!(conns.evict_longest_idle(false));
        assert!(c.done.load(Ordering::Relaxed) && !b.done.load(Ordering::Relaxed));
        assert!(conns.evict_longest_idle(false));
        assert!(b.done.load(Ordering::Relaxed));
        // Only the busy one is left.
        assert!(!conns.evict_longest_idle(false));
        assert!(!a.done.load(Ordering::Relaxed));
    }

    #[test]
    fn a_response_dropped_makes_its_connection_idle_from_then() {
        let conns = Conns::default();
        let c = add(&conns);
        age(&c, Duration::from_secs(5));
        let busy = c.start();
        assert!(c.busy() && c.idle_for(Instant::now()).is_none());
        drop(busy);
        let idle = c.idle_for(Instant::now()).unwrap();
        assert!(idle < Duration::from_secs(1), "{idle:?}");
        assert!(!conns.evict_longest_idle(false), "idle only since now");
    }

    #[test]
    fn only_regular_holders_make_room_for_a_regular_slot() {
        let conns = Conns::default();
        let spare = add(&conns);
        age(&spare, Duration::from_secs(3));
        assert!(!conns.evict_longest_idle(true));
        spare.holds_regular();
        assert!(conns.evict_longest_idle(true));
    }
}
