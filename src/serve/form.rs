//! `multipart/form-data` (RFC 7578): what the official `openai` clients send to `POST
//! /v1/videos`. Each text part's `name` and its text become one field of a JSON object
//! the request type then reads as it reads JSON; a part with a `filename` (an uploaded
//! file: the client's `input_reference=open("first.png", "rb")`) is kept as its bytes,
//! its name, file name and declared type, for the request type to take or refuse by
//! name. A name given twice is refused by name. The body is already bounded by the
//! route's limit, and a file is a slice of it, not a copy.

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

/// A form's parts: its text fields, and its files in the order sent.
#[derive(Debug, Default)]
pub struct Form<'a> {
    pub fields: Map<String, Value>,
    pub files: Vec<FilePart<'a>>,
}

/// One uploaded file of a form.
#[derive(Debug)]
pub struct FilePart<'a> {
    /// The part's `name` (the field it fills).
    pub name: String,
    /// The part's `filename` (httpx sends `upload` for bytes without one).
    pub filename: String,
    /// The part's `Content-Type`, when it says one.
    pub content_type: Option<String>,
    pub bytes: &'a [u8],
}

/// The parts of a form body delimited by `boundary`.
pub fn parse<'a>(body: &'a [u8], boundary: &str) -> Result<Form<'a>, ApiError> {
    let bad = |problem: &str| {
        ApiError::invalid_body(format!("the multipart/form-data body {problem}; send the fields as JSON (Content-Type: application/json) or as a well-formed form"))
    };
    let delimiter = format!("--{boundary}");
    let mut pieces = split(body, delimiter.as_bytes()).into_iter();
    // What precedes the first delimiter is the preamble, ignored.
    pieces.next();
    let mut form = Form::default();
    for piece in pieces {
        if piece.starts_with(b"--") {
            return Ok(form);
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
        let name = disposition_parameter(headers, "name")
            .ok_or_else(|| bad("has a part without a Content-Disposition name"))?;
        let twice = || ApiError::bad_request(&name, format!("{name} is given twice"));
        if form.fields.contains_key(&name) || form.files.iter().any(|file| file.name == name) {
            return Err(twice());
        }
        if let Some(filename) = disposition_parameter(headers, "filename") {
            form.files.push(FilePart {
                content_type: header(headers, "content-type"),
                name,
                filename,
                bytes: value,
            });
            continue;
        }
        let value = std::str::from_utf8(value)
            .map_err(|_| ApiError::bad_request(&name, format!("{name} is not UTF-8 text")))?;
        form.fields.insert(name, Value::String(value.to_string()));
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

/// The value of a header line `key:` (case-insensitive), trimmed.
fn header(headers: &str, key: &str) -> Option<String> {
    headers.split("\r\n").find_map(|line| {
        let (found, value) = line.split_once(':')?;
        found
            .trim()
            .eq_ignore_ascii_case(key)
            .then(|| value.trim().to_string())
    })
}

/// The parameter `key` (`name`, `filename`) of a part's `Content-Disposition:
/// form-data; name="…"; filename="…"`.
fn disposition_parameter(headers: &str, key: &str) -> Option<String> {
    let disposition = header(headers, "content-disposition")?;
    disposition.split(';').find_map(|parameter| {
        let (found, value) = parameter.split_once('=')?;
        (found.trim() == key).then(|| value.trim().trim_matches('"').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_reads_its_text_as_json_fields_and_keeps_its_files() {
        // Proves the form httpx writes for the openai client reads field by field, a
        // file part is kept as its bytes with its file name and type, and a name given
        // twice (as a field or as a file) is refused by name.
        let content_type = "multipart/form-data; boundary=abc";
        let boundary = boundary(content_type).expect("a boundary");
        let body = b"--abc\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na fox\r\nin snow\r\n--abc\r\nContent-Disposition: form-data; name=\"seconds\"\r\n\r\n4\r\n--abc\r\nContent-Disposition: form-data; name=\"input_reference\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n\x89PNG\r\n\x00\r\n--abc--\r\n";
        let form = parse(body, &boundary).expect("a form");
        assert_eq!(form.fields["prompt"], "a fox\r\nin snow");
        assert_eq!(form.fields["seconds"], "4");
        let [file] = &form.files[..] else {
            panic!("one file: {:?}", form.files);
        };
        assert_eq!(file.name, "input_reference");
        assert_eq!(file.filename, "a.png");
        assert_eq!(file.content_type.as_deref(), Some("image/png"));
        assert_eq!(file.bytes, b"\x89PNG\r\n\x00");
        assert_eq!(super::boundary("application/json"), None);
        let twice = "--abc\r\nContent-Disposition: form-data; name=\"seed\"\r\n\r\n1\r\n--abc\r\nContent-Disposition: form-data; name=\"seed\"\r\n\r\n2\r\n--abc--\r\n";
        let error = parse(twice.as_bytes(), &boundary).expect_err("refused");
        assert_eq!(error.param.as_deref(), Some("seed"));
        let files = b"--abc\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\n1\r\n--abc\r\nContent-Disposition: form-data; name=\"f\"; filename=\"b\"\r\n\r\n2\r\n--abc--\r\n";
        let error = parse(files, &boundary).expect_err("refused");
        assert_eq!(error.param.as_deref(), Some("f"));
        let open = b"--abc\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\n1\r\n";
        let error = parse(open, &boundary).expect_err("refused");
        assert!(
            error.message.contains("no closing boundary"),
            "{}",
            error.message
        );
    }
}
