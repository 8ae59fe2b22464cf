//! The compute port's conformance suite on the CPU adapter (the same suite runs on the
//! CUDA adapter in `tests/cuda.rs` on a GPU): every operation against the plain f64
//! reference of its definition, every output non-degenerate, and a second pass equal
//! bit for bit.

#[path = "compute_port/ops.rs"]
mod ops;

use stagehand::device::CpuCompute;

#[test]
fn every_operation_of_the_cpu_adapter_matches_the_plain_reference() {
    let compute = CpuCompute::new();
    let outputs = ops::run_ops(&compute, &ops::host_read_back).expect("the scenario runs");
    let misses = ops::reference_misses(&outputs);
    assert!(
        misses.is_empty(),
        "against the plain reference: {misses:#?}"
    );
    assert!(
        outputs.values.len() > 20,
        "{} outputs",
        outputs.values.len()
    );
    for kept in &outputs.values {
        assert!(
            kept.values.iter().any(|value| value.abs() > 1e-3)
                && kept.values.iter().all(|v| v.is_finite()),
            "{}: degenerate output",
            kept.what
        );
    }
    assert_eq!(outputs.merged.len(), 10);
    assert_eq!(outputs.checksums.len(), 5);
}

#[test]
fn the_cpu_adapter_repeats_every_operation_bit_for_bit() {
    let compute = CpuCompute::new();
    let first = ops::run_ops(&compute, &ops::host_read_back).expect("first pass");
    let second = ops::run_ops(&compute, &ops::host_read_back).expect("second pass");
    ops::assert_same_bits(&first, &second);
}

#[path = "compute_port/diffusion.rs"]
mod diffusion;

#[test]
fn the_cpu_adapter_has_the_diffusion_operations_and_checks_their_shapes() {
    // Proves the Flux kernels match their f64 definitions and refuse misshapen input.
    let compute = CpuCompute::new();
    let results = diffusion::diffusion_misses(&compute).expect("the cpu has them");
    assert_eq!(results.len(), 6);
    for (what, difference) in &results {
        assert!(*difference < diffusion::TOLERANCE, "{what}: {difference}");
    }
    assert_eq!(
        diffusion::diffusion_shape_errors(&compute).expect("runs"),
        4
    );
}

#[path = "compute_port/quantized.rs"]
mod quantized;

#[test]
fn int8_and_awq_weights_compute_their_dequantised_values_on_the_cpu() {
    // Proves int8_tensorwise (code × scale) and awq_w4a16 ((q − 8)·scale + zero per
    // group, low nibble first, tables [in / 64, out]) linears match the plain
    // reference of the dequantised weight, few rows and many, across panels and for a
    // slice of a fused weight's rows; a table past its block is refused.
    let compute = CpuCompute::new();
    let misses = quantized::quantized_linear_misses(&compute, true).expect("runs");
    assert_eq!(misses.len(), 12);
    for (what, difference, _) in &misses {
        assert!(*difference <= quantized::TOLERANCE, "{what}: {difference}");
    }
    assert!(quantized::awq_tables_outside_the_block_are_refused(&compute).expect("runs"));
}

#[test]
fn awq_products_give_the_same_bits_on_any_number_of_threads() {
    // Proves the dequantised panels and their products do not depend on the thread
    // count (the streamed and resident passes may run with different counts).
    let one = CpuCompute::with_threads(1);
    let two = CpuCompute::with_threads(2);
    let first = quantized::quantized_linear_misses(&one, true).expect("runs");
    let second = quantized::quantized_linear_misses(&two, true).expect("runs");
    for ((what, _, a), (_, _, b)) in first.iter().zip(&second) {
        let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "{what}");
    }
}
