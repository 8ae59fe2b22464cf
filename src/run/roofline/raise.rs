//! A bound no step can beat: when a step computed (or copied) faster than the roofline
//! allows, a figure was measured too low — on a busier machine, or at idle clocks —
//! and is raised to what the step reached. The raised roofline is cached, so the next
//! run's bound starts from it; `stagehand calibrate --roofline` measures afresh.

use crate::compute::work::Work;
use crate::compute::ComputeDtype;

use super::{Raised, Roofline};

/// A raised roofline and by how much the step's floor was above what it measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Raise {
    pub roofline: Roofline,
    /// The floor before over the step's measured compute (> 1).
    pub factor: f64,
}

impl Roofline {
    /// This roofline raised so that `work`'s floor under `compute_dtype` is no more than
    /// `measured_seconds`, the compute a step of that work took; `None` where the floor
    /// already is (or nothing was measured). The figure that sets most of the floor is
    /// raised alone where that suffices; else memory bandwidth and FLOP/s together by
    /// one factor, which scales every kernel's floor by exactly that factor.
    pub fn raised_to_step(
        &self,
        compute_dtype: ComputeDtype,
        work: &Work,
        measured_seconds: f64,
        now_unix: u64,
    ) -> Option<Raise> {
        let floor = self.for_compute_dtype(compute_dtype).floor(work);
        if measured_seconds <= 0.0 || floor.seconds <= measured_seconds {
            return None;
        }
        let flops_seconds = floor.seconds - floor.memory_seconds;
        let mut raised = self.clone();
        let mut memory_factor = 1.0;
        let mut flops_factor = 1.0;
        if floor.memory_seconds >= flops_seconds && measured_seconds > flops_seconds {
            memory_factor = floor.memory_seconds / (measured_seconds - flops_seconds);
        } else if flops_seconds > floor.memory_seconds && measured_seconds > floor.memory_seconds {
            flops_factor = flops_seconds / (measured_seconds - floor.memory_seconds);
        }
        raised.scale(compute_dtype, memory_factor, flops_factor);
        // A kernel the raise moved from one side to the other can leave the floor
        // above the step: then both figures by what is left.
        let left = raised.for_compute_dtype(compute_dtype).floor(work).seconds;
        if left > measured_seconds * (1.0 + 1e-9) {
            let both = left / measured_seconds;
            raised.scale(compute_dtype, both, both);
            memory_factor *= both;
            flops_factor *= both;
        }
        // Factors under half a percent (a rounding's worth) are not worth a word.
        let mut what = Vec::new();
        if memory_factor >= 1.005 {
            what.push(format!("memory bandwidth ×{memory_factor:.2}"));
        }
        if flops_factor >= 1.005 {
            what.push(format!(
                "{} FLOP/s ×{flops_factor:.2}",
                compute_dtype.name()
            ));
        }
        if what.is_empty() {
            what.push(format!(
                "memory bandwidth ×{memory_factor:.3}, {} FLOP/s ×{flops_factor:.3}",
                compute_dtype.name()
            ));
        }
        raised.raised = Some(Raised {
            at_unix: now_unix,
            what: what.join(" and "),
        });
        Some(Raise {
            roofline: raised,
            factor: floor.seconds / measured_seconds,
        })
    }

    /// This roofline with its copy rate raised to `copied_bytes_per_second`, what a
    /// run's steps copied at least; `None` where it is not above the cached rate.
    pub fn raised_copy_rate(&self, copied_bytes_per_second: f64, now_unix: u64) -> Option<Raise> {
        if copied_bytes_per_second <= self.copy_bytes_per_second {
            return None;
        }
        let factor = copied_bytes_per_second / self.copy_bytes_per_second.max(1e-9);
        // A compute raise by the same run a moment ago is kept beside this one.
        let earlier = (self.raised.as_ref())
            .filter(|raised| raised.at_unix == now_unix)
            .map_or_else(String::new, |raised| format!("{} and ", raised.what));
        Some(Raise {
            roofline: Roofline {
                copy_bytes_per_second: copied_bytes_per_second,
                raised: Some(Raised {
                    at_unix: now_unix,
                    what: format!("{earlier}copy rate ×{factor:.2}"),
                }),
                ..self.clone()
            },
            factor,
        })
    }

    /// Memory bandwidth by `memory`, the product rate of `compute_dtype` by `flops`.
    fn scale(&mut self, compute_dtype: ComputeDtype, memory: f64, flops: f64) {
        self.memory_bytes_per_second *= memory;
        match compute_dtype {
            ComputeDtype::F32 => self.flops_per_second *= flops,
            ComputeDtype::Bf16 => self.bf16_flops_per_second *= flops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::work::Kernel;
    use crate::compute::DType;

    fn roofline() -> Roofline {
        super::super::test_roofline()
    }

    fn work(rows: &[u64]) -> Work {
        Work {
            kernels: rows
                .iter()
                .map(|&rows| Kernel::Linear {
                    rows,
                    inner: 2048,
                    outer: 8192,
                    dtype: DType::Bf16,
                })
                .collect(),
        }
    }

    #[test]
    fn a_floor_the_step_did_not_beat_is_kept() {
        let work = work(&[1]);
        let floor = roofline().floor(&work).seconds;
        assert_eq!(
            roofline().raised_to_step(ComputeDtype::F32, &work, floor, 7),
            None
        );
        assert_eq!(
            roofline().raised_to_step(ComputeDtype::F32, &work, 0.0, 7),
            None
        );
    }

    #[test]
    fn a_memory_bound_step_that_beat_its_floor_raises_the_bandwidth_alone() {
        let work = work(&[1, 1]);
        let floor = roofline().floor(&work).seconds;
        let raise = roofline()
            .raised_to_step(ComputeDtype::F32, &work, floor / 2.0, 7)
            .expect("raised");
        assert!((raise.factor - 2.0).abs() < 1e-9);
        assert!((raise.roofline.memory_bytes_per_second - 40e9).abs() < 1.0);
        assert_eq!(raise.roofline.flops_per_second, 100e9);
        let after = raise.roofline.floor(&work).seconds;
        assert!(after <= floor / 2.0 * (1.0 + 1e-12), "{after}");
        let raised = raise.roofline.raised.expect("noted");
        assert_eq!(
            (raised.at_unix, raised.what.as_str()),
            (7, "memory bandwidth ×2.00")
        );
    }

    #[test]
    fn a_flop_bound_step_raises_its_dtypes_product_rate_and_a_mixed_one_both() {
        let batch = work(&[512]);
        let floor = roofline()
            .for_compute_dtype(ComputeDtype::Bf16)
            .floor(&batch);
        let raise = roofline()
            .raised_to_step(ComputeDtype::Bf16, &batch, floor.seconds / 1.5, 0)
            .expect("raised");
        assert!((raise.roofline.bf16_flops_per_second - 600e9).abs() < 1e3);
        assert_eq!(raise.roofline.flops_per_second, 100e9);
        assert_eq!(raise.roofline.memory_bytes_per_second, 20e9);
        // Two hundred times faster than a floor of memory- and FLOP-bound kernels: the
        // step took less than the memory-bound kernel's floor alone, so FLOP/s alone
        // cannot bring the floor down to it and both rise.
        let mixed = work(&[1, 512]);
        let floor = roofline().floor(&mixed).seconds;
        let raise = roofline()
            .raised_to_step(ComputeDtype::F32, &mixed, floor / 200.0, 0)
            .expect("raised");
        let after = raise.roofline.floor(&mixed).seconds;
        assert!(
            after <= floor / 200.0 * (1.0 + 1e-12),
            "{after} > {}",
            floor / 200.0
        );
        assert!(raise.roofline.flops_per_second > 100e9);
        assert!(raise.roofline.memory_bytes_per_second > 20e9);
    }

    #[test]
    fn a_run_that_copied_faster_raises_the_copy_rate_to_its_own() {
        assert_eq!(roofline().raised_copy_rate(5e9, 0), None);
        let raise = roofline().raised_copy_rate(15e9, 3).expect("raised");
        assert_eq!(raise.roofline.copy_bytes_per_second, 15e9);
        assert!((raise.factor - 1.5).abs() < 1e-12);
        // After a compute raise by the same run, both are named.
        let work = work(&[1]);
        let floor = roofline().floor(&work).seconds;
        let compute = roofline()
            .raised_to_step(ComputeDtype::F32, &work, floor / 2.0, 3)
            .expect("raised");
        let both = compute.roofline.raised_copy_rate(15e9, 3).expect("raised");
        let what = both.roofline.raised.expect("noted").what;
        assert_eq!(what, "memory bandwidth ×2.00 and copy rate ×1.50");
    }
}
