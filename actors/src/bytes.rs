//! The one way stagehand shows a size.
//!
//! Binary units (B, KiB, MiB, GiB, TiB, PiB), because that is what `nvidia-smi`,
//! `free -g` and the budgets mean. The value is shown in the largest unit that keeps it
//! at least 1, rounded to two decimals; a whole number drops the decimals. So
//! `96 MiB`, `7.45 GiB`, `1.50 GiB`, `512 B`. Every human-readable size (config, run
//! and simulate summaries, errors, logs) goes through [`Bytes`]; machine-readable
//! output (JSON) carries integer bytes instead (see [`as_integer`]).

/// Bytes, displayed in binary units ("96 MiB", "7.45 GiB").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
#[serde(transparent)]
pub struct Bytes(pub u64);

const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64;
        let mut unit = 0;
        // Round first, so 1023.999 MiB is shown as 1 GiB, not "1024 MiB".
        while unit + 1 < UNITS.len() && (value * 100.0).round() / 100.0 >= 1024.0 {
            value /= 1024.0;
            unit += 1;
        }
        let hundredths = (value * 100.0).round();
        if hundredths % 100.0 == 0.0 {
            write!(f, "{:.0} {}", hundredths / 100.0, UNITS[unit])
        } else {
            write!(f, "{:.2} {}", hundredths / 100.0, UNITS[unit])
        }
    }
}

impl Bytes {
    /// A flag value (`--vram-budget 65.79MiB`) that parses to at least these bytes: a
    /// whole unit when the size is one, else rounded *up* to the next hundredth of the
    /// unit `Display` uses, so a suggested "at least" value is never a byte short.
    pub fn flag_value_at_least(self) -> String {
        if self.0 < 1024 {
            return format!("{}B", self.0);
        }
        let mut unit = 0;
        let mut scale = 1u64;
        while unit + 1 < UNITS.len() && self.0 as f64 / scale as f64 >= 1024.0 {
            unit += 1;
            scale <<= 10;
        }
        if self.0 % scale == 0 {
            return format!("{}{}", self.0 / scale, UNITS[unit]);
        }
        // The smallest hundredth of the unit at or above the size, checked the way a
        // size parser computes it (decimal text × unit in f64, truncated), one more
        // hundredth when that falls short.
        // f64 is off by far less than a hundredth, so two tries always suffice.
        let first = (u128::from(self.0) * 100).div_ceil(u128::from(scale)) as u64;
        for hundredths in first..first + 2 {
            let text = format!("{}.{:02}", hundredths / 100, hundredths % 100);
            let parsed = text
                .parse::<f64>()
                .map_or(0, |value| (value * scale as f64) as u64);
            if parsed >= self.0 {
                return format!("{text}{}", UNITS[unit]);
            }
        }
        format!("{}{}", self.0.div_ceil(scale), UNITS[unit])
    }
}

impl Bytes {
    /// A flag value that parses to at most these bytes (rounded *down* to a hundredth
    /// of the unit), for "lower --pin-ceiling to …" advice.
    pub fn flag_value_at_most(self) -> String {
        if self.0 < 1024 {
            return format!("{}B", self.0);
        }
        let mut unit = 0;
        let mut scale = 1u64;
        while unit + 1 < UNITS.len() && self.0 as f64 / scale as f64 >= 1024.0 {
            unit += 1;
            scale <<= 10;
        }
        let first = (u128::from(self.0) * 100 / u128::from(scale)) as u64;
        for hundredths in (first.saturating_sub(1)..=first).rev() {
            let text = format!("{}.{:02}", hundredths / 100, hundredths % 100);
            let parsed = text
                .parse::<f64>()
                .map_or(u64::MAX, |value| (value * scale as f64) as u64);
            if parsed <= self.0 {
                return format!("{}{}", text.trim_end_matches(".00"), UNITS[unit]);
            }
        }
        format!("{}B", self.0)
    }
}

impl From<u64> for Bytes {
    fn from(bytes: u64) -> Self {
        Bytes(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::Bytes;

    #[test]
    fn sizes_have_one_fixed_precision() {
        // Proves the documented format: largest unit ≥ 1, two decimals, whole numbers
        // bare, rounding that carries into the next unit.
        let shown = |bytes: u64| Bytes(bytes).to_string();
        assert_eq!(shown(0), "0 B");
        assert_eq!(shown(1023), "1023 B");
        assert_eq!(shown(1024), "1 KiB");
        assert_eq!(shown(96 << 20), "96 MiB");
        assert_eq!(shown(8_000_000_000), "7.45 GiB");
        assert_eq!(shown(3 << 29), "1.50 GiB");
        assert_eq!(shown((1 << 30) - 1), "1 GiB");
        assert_eq!(shown(68_971_110), "65.78 MiB");
        assert_eq!(shown(u64::MAX), "16384 PiB");
    }

    #[test]
    fn flag_values_round_up() {
        // Proves a suggested "at least" value is never below the size it stands for.
        assert_eq!(Bytes(48 << 20).flag_value_at_least(), "48MiB");
        assert_eq!(Bytes(68_971_110).flag_value_at_least(), "65.78MiB");
        assert_eq!(Bytes(3 << 19).flag_value_at_least(), "1.50MiB");
        assert_eq!(Bytes(68_975_330).flag_value_at_least(), "65.79MiB");
        assert_eq!(Bytes(100).flag_value_at_least(), "100B");
        assert_eq!(Bytes((2 << 30) + 1).flag_value_at_least(), "2.01GiB");
        assert_eq!(Bytes((2 << 30) + 1).flag_value_at_most(), "2GiB");
        assert_eq!(Bytes(68_975_330).flag_value_at_most(), "65.78MiB");
    }
}
