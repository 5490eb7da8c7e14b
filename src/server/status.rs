//! The one place errors become gRPC codes and HTTP statuses.

use axum::http::StatusCode;
use tonic::{Code, Status};

use crate::error::{Error, ErrorKind};

/// The gRPC code of each kind of failure: the one map every front end
/// and the admin API use.
pub fn kind_code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::BadRequest => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::Precondition => Code::FailedPrecondition,
        ErrorKind::Exhausted => Code::ResourceExhausted,
        ErrorKind::Conflict => Code::Aborted,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::Denied => Code::PermissionDenied,
        ErrorKind::Internal => Code::Internal,
    }
}

/// The gRPC code for an error.
pub fn code(e: &Error) -> Code {
    kind_code(e.kind())
}

/// A refusal of `kind` with `message` (which says what was wrong and what
/// to do), for checks made at the front end itself.
pub fn refusal(kind: ErrorKind, message: impl Into<String>) -> Status {
    Status::new(kind_code(kind), message)
}

/// The gRPC status for an error; the message is the error's text, which
/// says what was wrong and what to do.
pub fn to_status(e: &Error) -> Status {
    let mut status = Status::new(code(e), e.to_string());
    if matches!(e, Error::LayoutChanged(_)) {
        // Nodes already restarted on the new layout serve: clients may
        // try them (the code stays FAILED_PRECONDITION for everyone else).
        status.metadata_mut().insert(
            idgen_proto::RETRY_ELSEWHERE,
            tonic::metadata::MetadataValue::from_static("layout-changed"),
        );
    }
    status
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

    #[test]
    fn a_layout_change_refusal_tells_clients_to_try_another_node() {
        let changed = to_status(&Error::LayoutChanged("from A to B".into()));
        assert_eq!(changed.code(), Code::FailedPrecondition);
        assert_eq!(
            changed
                .metadata()
                .get(idgen_proto::RETRY_ELSEWHERE)
                .and_then(|v| v.to_str().ok()),
            Some("layout-changed")
        );
        assert!(to_status(&Error::Fenced)
            .metadata()
            .get(idgen_proto::RETRY_ELSEWHERE)
            .is_none());
    }

    use crate::id::segment::SegmentError;
    use crate::id::{GenError, Mode, RequestError};
    use crate::store::StoreError;

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
        let unknown = Error::from(StoreError::Segment(SegmentError::TagNotFound("t".into())));
        assert_eq!(code(&unknown), Code::NotFound);
        let bad = Error::from(StoreError::Segment(SegmentError::BadTag("T".into())));
        assert_eq!(code(&bad), Code::InvalidArgument);
        let gone = Error::Store(StoreError::Contended("busy".into()));
        assert_eq!(code(&gone), Code::Unavailable);
        assert_eq!(
            http_status(Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(code_name(Code::FailedPrecondition), "FAILED_PRECONDITION");
    }

    #[test]
    fn each_kind_has_one_grpc_code_and_one_http_status() {
        let table = [
            (ErrorKind::BadRequest, Code::InvalidArgument, 400),
            (ErrorKind::NotFound, Code::NotFound, 404),
            (ErrorKind::AlreadyExists, Code::AlreadyExists, 409),
            (ErrorKind::Precondition, Code::FailedPrecondition, 400),
            (ErrorKind::Exhausted, Code::ResourceExhausted, 429),
            (ErrorKind::Conflict, Code::Aborted, 409),
            (ErrorKind::Unavailable, Code::Unavailable, 503),
            (ErrorKind::Unauthenticated, Code::Unauthenticated, 401),
            (ErrorKind::Denied, Code::PermissionDenied, 403),
            (ErrorKind::Internal, Code::Internal, 500),
        ];
        for (kind, grpc, http) in table {
            assert_eq!(kind_code(kind), grpc, "{kind:?}");
            assert_eq!(http_status(kind_code(kind)).as_u16(), http, "{kind:?}");
            let status = refusal(kind, "why");
            assert_eq!((status.code(), status.message()), (grpc, "why"));
        }
    }
}
