//! The one place errors become gRPC codes and HTTP statuses.

use axum::http::StatusCode;
use tonic::{Code, Status};

use crate::error::Error;
use crate::id::lease::LeaseError;
use crate::id::segment::SegmentError;
use crate::id::strict::StrictError;
use crate::id::{GenError, RequestError, StartError};
use crate::store::StoreError;

/// The gRPC code for an error.
pub fn code(e: &Error) -> Code {
    match e {
        Error::Request(RequestError::ModeNotEnabled(_)) => Code::FailedPrecondition,
        Error::Request(_) | Error::Decode(_) => Code::InvalidArgument,
        Error::Gen(GenError::TimeExhausted) => Code::ResourceExhausted,
        Error::Store(StoreError::TagNotFound(_)) => Code::NotFound,
        Error::Store(StoreError::TagExists(_)) => Code::AlreadyExists,
        Error::Store(StoreError::StrictKeyNotFound(_)) => Code::NotFound,
        Error::Store(StoreError::LimitReached { .. }) => Code::ResourceExhausted,
        Error::Store(StoreError::Segment(SegmentError::Exhausted { .. })) => {
            Code::ResourceExhausted
        }
        Error::Store(StoreError::Segment(_)) => Code::InvalidArgument,
        Error::Store(StoreError::Lease(
            LeaseError::TokenExhausted { .. }
            | LeaseError::NoFreeToken { .. }
            | LeaseError::RangeExhausted { .. },
        )) => Code::ResourceExhausted,
        Error::Store(StoreError::Lease(_)) => Code::InvalidArgument,
        Error::Store(StoreError::Strict(StrictError::Exhausted { .. })) => Code::ResourceExhausted,
        Error::Store(StoreError::Strict(_)) => Code::InvalidArgument,
        Error::Gen(_)
        | Error::Store(_)
        | Error::WaitTimeout { .. }
        | Error::Fenced
        | Error::SegmentUnavailable { .. }
        | Error::LeaseUnavailable { .. }
        | Error::StrictUnavailable { .. }
        | Error::WorkerLock(_)
        | Error::Consul(_) => Code::Unavailable,
        Error::Start(StartError::ClockBehindHwm { .. }) => Code::Unavailable,
        Error::Layout(_) | Error::Start(StartError::Layout(_)) => Code::FailedPrecondition,
        Error::Setup(_) => Code::Internal,
        Error::ClusterLayout(e) => {
            use crate::store::cluster_layout::ClusterLayoutError as L;
            match e {
                L::Mismatch { .. } | L::Unsafe { .. } | L::Invalid { .. } | L::Corrupt { .. } => {
                    Code::FailedPrecondition
                }
                L::BadRequest(_) => Code::InvalidArgument,
                L::Conflict { .. } => Code::Aborted,
                L::Changing { .. } | L::Consul(_) => Code::Unavailable,
            }
        }
    }
}

/// The gRPC status for an error; the message is the error's text, which
/// says what was wrong and what to do.
pub fn to_status(e: &Error) -> Status {
    Status::new(code(e), e.to_string())
}

/// The HTTP status used by the JSON API for a gRPC code.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The canonical upper-case name of a code, for JSON errors and metric labels.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::Mode;

    #[test]
    fn every_error_kind_has_the_documented_code() {
        let bad = Error::Request(RequestError::BadCount { got: 0, max: 10 });
        assert_eq!(code(&bad), Code::InvalidArgument);
        let off = Error::Request(RequestError::ModeNotEnabled(Mode::Segment));
        assert_eq!(code(&off), Code::FailedPrecondition);
        let back = Error::Gen(GenError::ClockStepBack {
            back_ms: 5000,
            limit_ms: 1000,
        });
        assert_eq!(code(&back), Code::Unavailable);
        assert_eq!(
            code(&Error::Gen(GenError::TimeExhausted)),
            Code::ResourceExhausted
        );
        let unknown = Error::Store(StoreError::TagNotFound("t".into()));
        assert_eq!(code(&unknown), Code::NotFound);
        let bad = Error::Store(StoreError::Segment(SegmentError::BadTag("T".into())));
        assert_eq!(code(&bad), Code::InvalidArgument);
        let gone = Error::Store(StoreError::Contended("busy".into()));
        assert_eq!(code(&gone), Code::Unavailable);
        assert_eq!(
            http_status(Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(code_name(Code::FailedPrecondition), "FAILED_PRECONDITION");
    }
}
