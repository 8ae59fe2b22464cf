//! Which machine a roofline was measured on, and when: a cached measurement is reused
//! only on the same host with the same CPU model, vector extensions and cores (a VM
//! moved to another host type, or given more cores, is measured again), and the run
//! summary says where its bound came from in a user's words.

use serde::{Deserialize, Serialize};

/// The machine a measurement was taken on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Machine {
    /// A hash of the host's name and its memory.
    pub host: u64,
    /// `/proc/cpuinfo`'s `model name` ("AMD EPYC 7763 64-Core Processor").
    pub cpu_model: String,
    /// The vector extensions the kernels may use (`avx2 fma avx512f …`), sorted.
    pub cpu_flags: String,
    /// The cores the measurement ran on.
    pub cores: usize,
    /// The CPU adapter's kernel path (`avx512`, `avx2`, `portable`…): a lower path
    /// forced for tests reaches less than the CPU, and is measured apart.
    #[serde(default)]
    pub kernel_path: String,
}

/// Flags (x86 `flags`, Arm `Features`) that change what the kernels can reach.
const KERNEL_FLAG_PREFIXES: &[&str] = &[
    "avx", "amx", "fma", "f16c", "sse4", "asimd", "sve", "bf16", "i8mm",
];

impl Machine {
    /// This machine, now.
    pub fn this_one() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |names: &[&str]| {
            cpuinfo
                .lines()
                .filter_map(|line| line.split_once(':'))
                .find(|(key, _)| names.contains(&key.trim()))
                .map(|(_, value)| value.trim().to_string())
                .unwrap_or_default()
        };
        let mut flags: Vec<&str> = Vec::new();
        let listed = field(&["flags", "Features"]);
        for flag in listed.split_whitespace() {
            let relevant = KERNEL_FLAG_PREFIXES
                .iter()
                .any(|prefix| flag.starts_with(prefix));
            if relevant && !flags.contains(&flag) {
                flags.push(flag);
            }
        }
        flags.sort_unstable();
        let model = field(&["model name", "Model", "CPU part"]);
        Machine {
            host: host_identity(),
            cpu_model: if model.is_empty() {
                std::env::consts::ARCH.to_string()
            } else {
                model
            },
            cpu_flags: flags.join(" "),
            cores: std::thread::available_parallelism().map_or(1, |count| count.get()),
            kernel_path: crate::device::cpu_compute::kernel_path().to_string(),
        }
    }

    /// "AMD EPYC, 2 cores, avx avx2 fma, avx2 kernels".
    pub fn describe(&self) -> String {
        let flags = if self.cpu_flags.is_empty() {
            String::new()
        } else {
            format!(", {}", self.cpu_flags)
        };
        let path = if self.kernel_path.is_empty() {
            String::new()
        } else {
            format!(", {} kernels", self.kernel_path)
        };
        format!("{}, {} cores{flags}{path}", self.cpu_model, self.cores)
    }
}

/// Which host this is: a hash of its name and its memory.
fn host_identity() -> u64 {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let memory = crate::os::total_ram_bytes().unwrap_or(0);
    crate::compute::checksum::checksum(format!("{}:{memory}", name.trim()).as_bytes())
}

/// Seconds since the epoch, now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// "2025-06-01 12:03 UTC".
pub fn utc_text(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let minutes_of_day = unix_seconds % 86_400 / 60;
    // Howard Hinnant's `civil_from_days`: the proleptic Gregorian date of a day count.
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        minutes_of_day / 60,
        minutes_of_day % 60
    )
}

/// "40 s", "12 min", "5 h", "3 days".
pub fn age_words(seconds: u64) -> String {
    match seconds {
        0..=119 => format!("{seconds} s"),
        120..=7199 => format!("{} min", seconds / 60),
        7200..=172_799 => format!("{} h", seconds / 3600),
        _ => format!("{} days", seconds / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_written_in_utc() {
        assert_eq!(utc_text(0), "1970-01-01 00:00 UTC");
        // 2000-02-29 (a leap day of a century leap year) 13:45.
        assert_eq!(utc_text(951_831_900), "2000-02-29 13:45 UTC");
        assert_eq!(utc_text(1_735_689_599), "2024-12-31 23:59 UTC");
    }

    #[test]
    fn this_machine_is_named_by_its_cpu_and_cores() {
        let machine = Machine::this_one();
        assert!(machine.cores >= 1);
        assert!(!machine.cpu_model.is_empty());
        assert_eq!(machine, Machine::this_one(), "the same machine twice");
        assert!(machine.describe().contains(&machine.cpu_model));
        // The kernel path is the CPU adapter's, so a forced lower path is told apart.
        assert_eq!(
            machine.kernel_path,
            crate::device::cpu_compute::kernel_path()
        );
        assert!(machine
            .describe()
            .ends_with(&format!("{} kernels", machine.kernel_path)));
    }
}
