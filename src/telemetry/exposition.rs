//! A small reader of the Prometheus text exposition, so tests and the run summary can
//! read back what a scrape would see (counter totals, gauge values) without an HTTP
//! client or a Prometheus library.

/// One sample line: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.as_str())
    }
}

/// A line of the exposition that is not a sample, comment or blank line.
#[derive(Debug, thiserror::Error)]
#[error("exposition line {line_number} is not a Prometheus sample ({reason}): {line:?}")]
pub struct ExpositionError {
    pub line_number: usize,
    pub line: String,
    pub reason: &'static str,
}

/// Parses every sample of a text exposition; `# HELP`/`# TYPE` comments are skipped.
pub fn parse(text: &str) -> Result<Vec<Sample>, ExpositionError> {
    let mut samples = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let error = |reason| ExpositionError {
            line_number: index + 1,
            line: line.to_string(),
            reason,
        };
        let (series, value_text) = match line.rfind('}') {
            Some(close) => (&line[..=close], line[close + 1..].trim()),
            None => line.split_once(' ').ok_or_else(|| error("no value"))?,
        };
        // A timestamp may follow the value; stagehand's exporter writes none.
        let value_text = value_text.split_whitespace().next().unwrap_or_default();
        let value = parse_value(value_text).ok_or_else(|| error("bad value"))?;
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .ok_or_else(|| error("unclosed labels"))?;
                (name, parse_labels(body).ok_or_else(|| error("bad labels"))?)
            }
            None => (series, Vec::new()),
        };
        samples.push(Sample {
            name: name.trim().to_string(),
            labels,
            value,
        });
    }
    Ok(samples)
}

/// Sums the samples named `name` whose labels include every pair of `matching`.
pub fn sum(samples: &[Sample], name: &str, matching: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|sample| sample.name == name)
        .filter(|sample| {
            matching
                .iter()
                .all(|(key, value)| sample.label(key) == Some(*value))
        })
        .map(|sample| sample.value)
        .sum()
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

fn parse_labels(body: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let (key, after_key) = rest.split_once('=')?;
        let mut chars = after_key.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            let (position, character) = chars.next()?;
            match character {
                '"' => break position,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    escaped => value.push(escaped),
                },
                other => value.push(other),
            }
        };
        labels.push((key.trim().to_string(), value));
        // Skip the closing quote, then an optional comma.
        rest = after_key[end + 2..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Some(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_labels_and_special_values() {
        // Proves the parser reads names, escaped label values and +Inf, and skips comments.
        let text = "# HELP a_total help\n# TYPE a_total counter\n\
                    a_total{from=\"disk\",to=\"vr\\\"am\"} 42\n\
                    b_bucket{le=\"+Inf\"} 3\nc 1.5e3\n";
        let samples = parse(text).expect("valid exposition");
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].label("to"), Some("vr\"am"));
        assert_eq!(sum(&samples, "a_total", &[("from", "disk")]), 42.0);
        assert_eq!(samples[1].label("le"), Some("+Inf"));
        assert_eq!(samples[2].value, 1500.0);
    }

    #[test]
    fn rejects_a_line_without_a_value() {
        // Proves a malformed line is an error naming the line, not a silent skip.
        let error = parse("ok 1\nbroken{a=\"b\"}\n").expect_err("malformed");
        assert_eq!(error.line_number, 2);
    }
}
