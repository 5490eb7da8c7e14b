//! A request's body, watched for its end, and the deadline on it.
//!
//! A call whose headers came but whose body has not (an HTTP/2 stream
//! without END_STREAM, an HTTP/1 request short of its Content-Length)
//! holds a connection without being served: tonic starts a unary or
//! server-streaming handler only once the whole request is in. Such a call
//! is *waiting for its body* (rule 34 in docs/SAFETY-RULES-26-ON.md):
//!
//! - while every open call of a connection waits for its body, the
//!   connection counts as waiting, like one that has not sent its headers
//!   or HTTP/2 preface, so it is closed first when its peer or the port is
//!   at its connection limit (`listener/table.rs`);
//! - a body not complete `server.request_body_timeout` after its headers
//!   *stalls*: the call is answered at once (DEADLINE_EXCEEDED on gRPC,
//!   408 on HTTP), counted in `idgen_requests_stalled_total{port}`, and its
//!   connection is marked stalled: whenever it serves no call, it counts
//!   as waiting since that stall.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::Activity;

/// A request body that tells its connection when it has arrived in full.
/// What the services behind [`serve`](super::serve) receive.
pub struct RequestBody {
    inner: Incoming,
    arrival: Option<Arrival>,
}

/// A body still on its way: counted in its connection's
/// [`Activity`] until it ends or is dropped.
struct Arrival {
    activity: Arc<Activity>,
    done: Arc<AtomicBool>,
}

impl Drop for Arrival {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        self.activity.body_arrived();
    }
}

/// Set once a call's body has arrived in full (or is no longer wanted).
#[derive(Debug, Clone)]
pub(super) struct Arrived(Arc<AtomicBool>);

impl RequestBody {
    /// Watches `inner`, a body of a call on `activity`'s connection.
    /// Returns the body and, unless it has already ended, the flag its end
    /// sets (a body that came with its headers costs nothing more).
    pub(super) fn watch(inner: Incoming, activity: &Arc<Activity>) -> (Self, Option<Arrived>) {
        if inner.is_end_stream() {
            return (
                Self {
                    inner,
                    arrival: None,
                },
                None,
            );
        }
        let done = Arc::new(AtomicBool::new(false));
        activity.body_pending();
        let arrival = Arrival {
            activity: Arc::clone(activity),
            done: Arc::clone(&done),
        };
        (
            Self {
                inner,
                arrival: Some(arrival),
            },
            Some(Arrived(done)),
        )
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(frame))) => frame.is_trailers() || self.inner.is_end_stream(),
            Poll::Pending => false,
        };
        if ended {
            // Dropping the arrival counts the body as arrived.
            self.arrival = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Resolves if the body behind `arrived` is still incomplete `limit` from
/// now (it stalled); otherwise never, so a call whose request came in
/// full runs as long as it needs.
pub(super) async fn stalled(arrived: Arrived, limit: Duration) {
    tokio::time::sleep(limit).await;
    if arrived.0.load(Ordering::Acquire) {
        std::future::pending::<()>().await;
    }
}

/// What a caller whose body stalled is told.
pub(super) fn stalled_message(limit: Duration) -> String {
    format!(
        "the request did not arrive in full within {} of its headers (server.request_body_timeout): send the whole request at once",
        humantime::format_duration(limit)
    )
}
