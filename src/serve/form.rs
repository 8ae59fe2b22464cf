//! `multipart/form-data` of text fields (RFC 7578): what the official `openai` clients
//! send to `POST /v1/videos` even without a file. Each part's `name` and its text
//! become one field of a JSON object the request type then reads as it reads JSON; a
//! part with a `filename` (an uploaded file) or a name given twice is refused by name.
//! The body is already bounded by `limits.max_body_bytes`.

use serde_json::{Map, Value};

use super::errors::ApiError;

/// The `boundary` of a `multipart/form-data` content type; `None` for anything else.
pub fn boundary(content_type: &str) -> Option<String> {
    let mut parts = content_type.split(';');
    let media = parts.next()?.trim();
    if !media.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    parts.find_map(|parameter| {
        let (key, value) = parameter.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"').to_string())
    })
}

/// The text fields of a form body delimited by `boundary`.
pub fn fields(body: &[u8], boundary: &str) -> Result<Map<String, Value>, ApiError> {
    let bad = |problem: &str| {
        ApiError::invalid_body(format!("the multipart/form-data body {problem}; send the fields as JSON (Content-Type: application/json) or as a form of text fields"))
    };
    let delimiter = format!("--{boundary}");
    let mut pieces = split(body, delimiter.as_bytes()).into_iter();
    // What precedes the first delimiter is the preamble, ignored.
    pieces.next();
    let mut fields = Map::new();
    for piece in pieces {
        if piece.starts_with(b"--") {
            return Ok(fields);
        }
        let piece = piece
            .strip_prefix(b"\r\n")
            .ok_or_else(|| bad("has a part without a line break after its boundary"))?;
        let blank = piece
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
            .ok_or_else(|| bad("has a part without headers"))?;
        let (headers, value) = (&piece[..blank], &piece[blank + 4..]);
        let value = value.strip_suffix(b"\r\n").unwrap_or(value);
        let headers =
            std::str::from_utf8(headers).map_err(|_| bad("has headers that are not UTF-8"))?;
        let name = field_name(headers)
            .ok_or_else(|| bad("has a part without a Content-Disposition name"))?;
        if headers.to_ascii_lowercase().contains("filename=") {
            return Err(ApiError::bad_request(
                &name,
                format!("{name}: files are not taken here (image-to-video is not served yet); leave it out"),
            ));
        }
        let value = std::str::from_utf8(value)
            .map_err(|_| ApiError::bad_request(&name, format!("{name} is not UTF-8 text")))?;
        if fields
            .insert(name.clone(), Value::String(value.to_string()))
            .is_some()
        {
            return Err(ApiError::bad_request(
                &name,
                format!("{name} is given twice"),
            ));
        }
    }
    Err(bad("has no closing boundary"))
}

/// `bytes` cut at each `delimiter` (the delimiters left out).
fn split<'a>(mut bytes: &'a [u8], delimiter: &[u8]) -> Vec<&'a [u8]> {
    let mut pieces = Vec::new();
    while let Some(at) = bytes
        .windows(delimiter.len())
        .position(|window| window == delimiter)
    {
        pieces.push(&bytes[..at]);
        bytes = &bytes[at + delimiter.len()..];
    }
    pieces.push(bytes);
    pieces
}

/// `name` of a part's `Content-Disposition: form-data; name="…"`.
fn field_name(headers: &str) -> Option<String> {
    let disposition = headers.split("\r\n").find(|line| {
        line.to_ascii_lowercase()
            .starts_with("content-disposition:")
    })?;
    disposition.split(';').find_map(|parameter| {
        let (key, value) = parameter.split_once('=')?;
        (key.trim() == "name").then(|| value.trim().trim_matches('"').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_of_text_fields_reads_as_json_fields() {
        // Proves the form httpx writes for the openai client reads field by field, and
        // that a file or a field given twice is refused by name.
        let content_type = "multipart/form-data; boundary=abc";
        let boundary = boundary(content_type).expect("a boundary");
        let body = "--abc\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na fox\r\nin snow\r\n--abc\r\nContent-Disposition: form-data; name=\"seconds\"\r\n\r\n4\r\n--abc--\r\n";
        let fields = fields(body.as_bytes(), &boundary).expect("fields");
        assert_eq!(fields["prompt"], "a fox\r\nin snow");
        assert_eq!(fields["seconds"], "4");
        assert_eq!(super::boundary("application/json"), None);
        let twice = "--abc\r\nContent-Disposition: form-data; name=\"seed\"\r\n\r\n1\r\n--abc\r\nContent-Disposition: form-data; name=\"seed\"\r\n\r\n2\r\n--abc--\r\n";
        let error = super::fields(twice.as_bytes(), &boundary).expect_err("refused");
        assert_eq!(error.param.as_deref(), Some("seed"));
        let file = b"--abc\r\nContent-Disposition: form-data; name=\"input_reference\"; filename=\"a.png\"\r\n\r\n\x89PNG\r\n--abc--\r\n";
        let error = super::fields(file, &boundary).expect_err("refused");
        assert_eq!(error.param.as_deref(), Some("input_reference"));
    }
}
