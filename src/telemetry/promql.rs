//! Just enough PromQL reading to check dashboards and rules against the catalog: which
//! metric names an expression selects, and Grafana's template variables substituted so
//! the expression can be sent to a real Prometheus.

use std::sync::OnceLock;

use regex::Regex;

/// Words that look like identifiers in PromQL but never name a metric.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "atan2",
];

struct Patterns {
    strings: Regex,
    matchers: Regex,
    ranges: Regex,
    grouping: Regex,
    tokens: Regex,
    variables: Regex,
}

fn patterns() -> &'static Patterns {
    static PATTERNS: OnceLock<Patterns> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        // These are fixed, tested literals; a typo would fail every test at once.
        let compile = |pattern: &str| Regex::new(pattern).expect("built-in PromQL pattern");
        Patterns {
            strings: compile(r#""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"#),
            matchers: compile(r"\{[^}]*\}"),
            ranges: compile(r"\[[^\]]*\]"),
            grouping: compile(
                r"(?i)\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
            ),
            tokens: compile(r"[0-9][0-9a-zA-Z_.]*|[a-zA-Z_:][a-zA-Z0-9_:]*"),
            variables: compile(r"\$\{([a-zA-Z0-9_]+)(?::[a-z]+)?\}|\$([a-zA-Z0-9_]+)"),
        }
    })
}

/// The metric names an expression selects, in order of first appearance.
///
/// Strings, label matchers, range selectors and grouping clauses are blanked first; of
/// the identifiers left, those followed by `(` are functions or aggregations and the
/// rest, keywords aside, are metric names.
pub fn referenced_metrics(expression: &str) -> Vec<String> {
    let patterns = patterns();
    let text = patterns.strings.replace_all(expression, " ");
    let text = patterns.matchers.replace_all(&text, " ");
    let text = patterns.ranges.replace_all(&text, " ");
    let text = patterns.grouping.replace_all(&text, " ");
    let mut names: Vec<String> = Vec::new();
    for token in patterns.tokens.find_iter(&text) {
        let word = token.as_str();
        if word.starts_with(|character: char| character.is_ascii_digit()) {
            continue;
        }
        if KEYWORDS.contains(&word.to_ascii_lowercase().as_str()) {
            continue;
        }
        let is_call = text[token.end()..].trim_start().starts_with('(');
        if is_call {
            continue;
        }
        if !names.iter().any(|name| name == word) {
            names.push(word.to_string());
        }
    }
    names
}

/// Replaces Grafana's template variables so a dashboard expression is plain PromQL:
/// the interval built-ins (`$__rate_interval`, `$__interval`, `$__range`) become
/// `window`, and dashboard variables (used inside `=~` matchers) match everything.
pub fn substitute_grafana_variables(expression: &str, window: &str) -> String {
    patterns()
        .variables
        .replace_all(expression, |captures: &regex::Captures<'_>| {
            let name = captures
                .get(1)
                .or_else(|| captures.get(2))
                .map_or("", |name| name.as_str());
            if name.starts_with("__") {
                window.to_string()
            } else {
                ".*".to_string()
            }
        })
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_metrics_but_not_functions_labels_or_keywords() {
        // Proves only selected metric names come out of a realistic expression.
        let expression = r#"histogram_quantile(0.99, sum by (le, from) (rate(a_seconds_bucket{from="disk", to=~"v.*"}[5m]))) / on (from) group_left b_total > bool 1e3 or c:rule"#;
        assert_eq!(
            referenced_metrics(expression),
            vec!["a_seconds_bucket", "b_total", "c:rule"]
        );
    }

    #[test]
    fn substitutes_interval_and_dashboard_variables() {
        // Proves Grafana variables turn into plain PromQL.
        let expression =
            r#"rate(x{instance=~"$instance"}[$__rate_interval]) + rate(x[${__range}])"#;
        assert_eq!(
            substitute_grafana_variables(expression, "1m"),
            r#"rate(x{instance=~".*"}[1m]) + rate(x[1m])"#
        );
    }
}
