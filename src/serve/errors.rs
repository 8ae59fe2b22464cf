//! Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`
//! with the status the official clients map to their exception types.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A request that could not be answered, and how to tell the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, …
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub param: Option<String>,
    /// Seconds a 429 or 503 asks the client to wait.
    pub retry_after_seconds: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            code: None,
            param: None,
            retry_after_seconds: None,
        }
    }

    /// 400: the request is wrong; `param` names the field.
    pub fn bad_request(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400 without a field to blame (a body that is not JSON).
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn unauthorized() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong API key: send `Authorization: Bearer KEY` with the server's api_key",
            )
        }
    }

    /// 401 on an admin route: the admin key is separate from the API key.
    pub fn unauthorized_admin() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong admin key: the admin endpoints take `Authorization: Bearer KEY` with the server's admin.key (not its api_key)",
            )
        }
    }

    /// 404 on an admin route of a server whose operator has not turned them on.
    pub fn admin_off() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "the admin endpoints are off on this server: its config has no [admin] table (key, model_roots)",
        )
    }

    /// 403: the request names something the server's operator has not allowed;
    /// `param` names the field.
    pub fn forbidden(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::FORBIDDEN, "permission_error", message)
        }
    }

    pub fn model_not_found(model: &str, served: &[String]) -> Self {
        Self {
            code: Some("model_not_found"),
            param: Some("model".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!(
                    "the model `{model}` is not served here; served: {}",
                    served.join(", ")
                ),
            )
        }
    }

    /// 404: no video job of that id (never made, deleted, or dropped by the bounds).
    pub fn video_not_found(id: &str) -> Self {
        Self {
            code: Some("video_not_found"),
            param: Some("video_id".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("no video `{id}`: it was never made, was deleted, or was dropped as the server keeps at most limits.max_video_jobs jobs and limits.max_video_bytes of MP4s (oldest finished first)"),
            )
        }
    }

    /// 409: the video has no content (yet): `code` says why.
    pub fn no_video_content(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: Some(code),
            ..Self::conflict(message)
        }
    }

    /// 429: the video job table is full of unfinished jobs.
    pub fn video_jobs_full(jobs: usize) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            retry_after_seconds: Some(5),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("the server holds {jobs} unfinished video jobs (limits.max_video_jobs); retry when one has finished, or DELETE one"),
            )
        }
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no endpoint {path}; see GET /v1/models, POST /v1/embeddings, /v1/completions, /v1/chat/completions"),
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the server's limit of {limit} bytes (limits.max_body_bytes)"),
        )
    }

    /// 413: one field of the body is larger than its limit; `param` names the field.
    pub fn field_too_large(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                message,
            )
        }
    }

    /// 429: the model's queue is full.
    pub fn queue_full(model: &str, depth: usize) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            retry_after_seconds: Some(1),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("the queue of `{model}` is full ({depth} requests waiting); retry after a second"),
            )
        }
    }

    /// 503: the server is draining (SIGTERM) or the model stopped.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            retry_after_seconds: Some(5),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    pub fn timeout(seconds: f64) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!("the request did not finish within {seconds} s (limits.request_timeout_seconds) and was cancelled"),
        )
    }

    /// 409: the request conflicts with what the server holds (a name already served).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "invalid_request_error", message)
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// A job's answer that is a run error, by kind: no room in the budget now is a
    /// 503 with `Retry-After` (as a completion's KV pages are), the caller's mistake
    /// a 400 naming `param`, anything else a 500.
    pub fn of_run(error: &crate::run::RunError, param: &str) -> Self {
        match error {
            crate::run::RunError::NoRoom { .. } => Self::unavailable(error.to_string()),
            _ if error.is_bad_input() => Self::bad_request(param, error.to_string()),
            _ => Self::failed(error.to_string()),
        }
    }

    /// The `outcome` label of the request counter.
    pub fn outcome(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::TOO_MANY_REQUESTS => "rejected",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            StatusCode::GATEWAY_TIMEOUT => "timeout",
            status if status.is_client_error() => "bad_request",
            _ => "failed",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after_seconds {
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::RunError;

    #[test]
    fn a_jobs_run_error_is_answered_by_its_kind() {
        // Proves an embedding batch that found no room is a 503 with Retry-After (as a
        // completion's), not the 400 every batch error was; a bad request stays a 400
        // naming the field and a bug a 500.
        let no_room = RunError::NoRoom {
            message: "activations do not fit".into(),
            source: None,
        };
        let answered = ApiError::of_run(&no_room.detached(), "input");
        assert_eq!(answered.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answered.retry_after_seconds, Some(5));
        assert_eq!(answered.message, "activations do not fit");
        let bad = RunError::BadRequest {
            field: "model".into(),
            message: "not an encoder".into(),
            source: None,
        };
        let answered = ApiError::of_run(&bad, "input");
        assert_eq!(answered.status, StatusCode::BAD_REQUEST);
        assert_eq!(answered.param.as_deref(), Some("input"));
        let bug = RunError::Internal {
            message: "a bug".into(),
            source: None,
        };
        assert_eq!(
            ApiError::of_run(&bug, "input").status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
