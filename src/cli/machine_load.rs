//! How busy the rest of the machine was while a benchmark ran, and whether its ratios
//! can be trusted.
//!
//! The bench compares runs made one after another in one process; a ratio is only
//! fair when the machine gave each run the same CPU. On a 2-core VM one other busy
//! process (a compiler) steals half the cores from some runs and not others: ratios of
//! 0.74–0.89 were measured that way where an idle machine gives 1.1–1.4. So the bench
//! samples, before and after: the load average (`/proc/loadavg`), the CPU time every
//! process took (`/proc/stat`) and the CPU time this process and its children took
//! (`/proc/self/stat`). The difference is what others took while we measured.

use serde::Serialize;

/// Other processes taking more than this share of all the CPUs make ratios unfair:
/// a tenth of a 2-core machine is a fifth of one core, about what a run varies by.
pub const UNTRUSTED_OTHER_SHARE: f64 = 0.10;

/// CPU time counters at one moment, in clock ticks (`USER_HZ`).
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    /// Every CPU, busy and idle.
    total_ticks: u64,
    /// Every CPU, busy (user, nice, system, irq, softirq, steal).
    busy_ticks: u64,
    /// This process and its waited-for children (user + system).
    own_ticks: u64,
    load_average: Option<f64>,
}

impl CpuSample {
    /// `None` where /proc cannot be read (not Linux).
    pub fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|field| field.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest is inside user).
        let field = |index: usize| cpu.get(index).copied().unwrap_or(0);
        let busy_ticks = field(0) + field(1) + field(2) + field(5) + field(6) + field(7);
        let total_ticks = busy_ticks + field(3) + field(4);
        Some(Self {
            total_ticks,
            busy_ticks,
            own_ticks: own_ticks()?,
            load_average: load_average(),
        })
    }
}

/// utime + stime + cutime + cstime of this process, from /proc/self/stat.
fn own_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: count fields after its ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) is index 11, up to cstime (17).
    (11..15)
        .map(|index| fields.get(index)?.parse::<u64>().ok())
        .sum()
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What the machine did besides the bench, between two samples.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MachineLoad {
    pub cpus: usize,
    /// One-minute load average before and after.
    pub load_average_before: Option<f64>,
    pub load_average_after: Option<f64>,
    /// Share of all the CPUs' time that other processes used (0..1).
    pub other_processes_share: f64,
    /// Share of all the CPUs' time this bench used (0..1).
    pub bench_share: f64,
    pub trustworthy: bool,
}

impl MachineLoad {
    pub fn between(before: CpuSample, after: CpuSample) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let total = after.total_ticks.saturating_sub(before.total_ticks).max(1) as f64;
        let busy = after.busy_ticks.saturating_sub(before.busy_ticks) as f64;
        let own = after.own_ticks.saturating_sub(before.own_ticks) as f64;
        let other_processes_share = ((busy - own).max(0.0) / total).min(1.0);
        Self {
            cpus,
            load_average_before: before.load_average,
            load_average_after: after.load_average,
            other_processes_share,
            bench_share: (own / total).min(1.0),
            trustworthy: other_processes_share <= UNTRUSTED_OTHER_SHARE,
        }
    }

    /// One plain sentence for the report.
    pub fn verdict(&self) -> String {
        let load = match (self.load_average_before, self.load_average_after) {
            (Some(before), Some(after)) => format!(", load average {before:.2} → {after:.2}"),
            _ => String::new(),
        };
        let measured = format!(
            "other processes used {:.0} % of the {} CPUs while the bench ran (the bench {:.0} %{load})",
            self.other_processes_share * 100.0,
            self.cpus,
            self.bench_share * 100.0
        );
        if self.trustworthy {
            format!("machine load: {measured}: the ratios can be trusted")
        } else {
            format!(
                "machine load: {measured}: THE RATIOS CANNOT BE TRUSTED (more than {:.0} % taken by others steals CPU from some runs and not others); rerun on an idle machine",
                UNTRUSTED_OTHER_SHARE * 100.0
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(total: u64, busy: u64, own: u64) -> CpuSample {
        CpuSample {
            total_ticks: total,
            busy_ticks: busy,
            own_ticks: own,
            load_average: Some(1.0),
        }
    }

    #[test]
    fn others_time_is_busy_time_less_our_own() {
        // 1000 ticks of CPU time passed; 600 busy, 450 of them ours: others took 15 %.
        let load = MachineLoad::between(sample(0, 0, 0), sample(1000, 600, 450));
        assert!((load.other_processes_share - 0.15).abs() < 1e-9);
        assert!((load.bench_share - 0.45).abs() < 1e-9);
        assert!(!load.trustworthy);
        assert!(
            load.verdict().contains("CANNOT BE TRUSTED"),
            "{}",
            load.verdict()
        );
        let idle = MachineLoad::between(sample(0, 0, 0), sample(1000, 460, 450));
        assert!(idle.trustworthy);
        assert!(
            idle.verdict().contains("can be trusted"),
            "{}",
            idle.verdict()
        );
    }

    #[test]
    fn this_process_can_be_sampled() {
        let sample = CpuSample::now().expect("/proc is readable on Linux");
        assert!(sample.total_ticks >= sample.busy_ticks);
        assert!(sample.busy_ticks > 0);
    }
}
