//! Requests above the size limit are answered RESOURCE_EXHAUSTED.
//!
//! tonic refuses a request above `max_decoding_message_size` with
//! OUT_OF_RANGE before any codec sees the bytes; the size is the caller's
//! to fix, so [`RequestSizeLayer`] rewrites that refusal to
//! RESOURCE_EXHAUSTED naming the limit and its setting.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tonic::codegen::http;
use tonic::Status;

/// Answers requests above the size limit with RESOURCE_EXHAUSTED naming the
/// limit and its setting, instead of tonic's OUT_OF_RANGE.
#[derive(Debug, Clone, Copy)]
pub struct RequestSizeLayer {
    limit: usize,
}

impl RequestSizeLayer {
    /// For a server whose services refuse messages above `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self { limit }
    }
}

impl<S> tower::Layer<S> for RequestSizeLayer {
    type Service = RequestSize<S>;

    fn layer(&self, inner: S) -> RequestSize<S> {
        RequestSize {
            inner,
            limit: self.limit,
        }
    }
}

/// See [`RequestSizeLayer`].
#[derive(Debug, Clone)]
pub struct RequestSize<S> {
    inner: S,
    limit: usize,
}

impl<S, B, R> tower::Service<http::Request<B>> for RequestSize<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = RequestSizeFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        RequestSizeFuture {
            inner: self.inner.call(request),
            limit: self.limit,
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner service's answer, with a size refusal rewritten; a plain
    /// wrapper, so a call costs no allocation here.
    pub struct RequestSizeFuture<F> {
        #[pin]
        inner: F,
        limit: usize,
    }
}

impl<F, R, E> Future for RequestSizeFuture<F>
where
    F: Future<Output = Result<http::Response<R>, E>>,
{
    type Output = Result<http::Response<R>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        rewrite_too_large(response.headers_mut(), *this.limit);
        Poll::Ready(Ok(response))
    }
}

/// tonic's refusal of a message above the limit, as it words it.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";

fn rewrite_too_large(headers: &mut http::HeaderMap, limit: usize) {
    if headers.get("grpc-status").map(http::HeaderValue::as_bytes) != Some(b"11") {
        return;
    }
    let Some(status) = Status::from_header_map(headers) else {
        return;
    };
    if !status.message().starts_with(TONIC_TOO_LARGE) {
        return;
    }
    let found = status
        .message()
        .split("found ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or("more than that");
    let fresh: http::Response<()> = Status::resource_exhausted(format!(
        "the request is {found} bytes, above this node's limit of {limit} bytes (server.max_request_size); send smaller requests"
    ))
    .into_http();
    for name in ["grpc-status", "grpc-message"] {
        match fresh.headers().get(name) {
            Some(value) => headers.insert(name, value.clone()),
            None => headers.remove(name),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tonics_size_refusal_is_rewritten() {
        let mut headers = Status::out_of_range(format!(
            "{TONIC_TOO_LARGE}: found 5242885 bytes, the limit is: 65536 bytes"
        ))
        .into_http::<()>()
        .headers()
        .clone();
        rewrite_too_large(&mut headers, 65_536);
        let status = Status::from_header_map(&headers).unwrap();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("5242885 bytes")
                && status
                    .message()
                    .contains("65536 bytes (server.max_request_size)"),
            "{}",
            status.message()
        );
        let mut other = Status::out_of_range("something else")
            .into_http::<()>()
            .headers()
            .clone();
        rewrite_too_large(&mut other, 65_536);
        assert_eq!(
            Status::from_header_map(&other).unwrap().code(),
            tonic::Code::OutOfRange
        );
    }
}
