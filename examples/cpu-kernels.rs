//! Times the CPU backend's products and attention at a 1B Llama's and MiniLM's shapes,
//! on 1 and on every core, and prints GB/s (decode) and GFLOP/s (many rows): the
//! kernel figures behind BENCHMARKS.md "Compute against PyTorch on the CPU backend".
//!
//!     cargo run --release --example cpu-kernels [-- [f32|bf16] [attention|minilm] THREADS...]
//!
//! `bf16` times the many-rows products under `compute_dtype = bf16` (AMX tiles where
//! the CPU has them); decode rows are the same either way. `attention` times only the
//! attention rows (many times over: a profile of it sees little else). `minilm` times
//! each operation of one all-MiniLM-L6-v2 layer on a batch of 32 × 40 tokens, in the
//! order the encoder runs them, and their sum (best of 50 each).

use std::time::Instant;

use stagehand::compute::{Attention, Compute, ComputeDtype, DType, Mask, TensorSlot};
use stagehand::device::CpuCompute;

/// (what, rows, inner, out)
const PRODUCTS: [(&str, usize, usize, usize); 10] = [
    ("decode q_proj", 1, 2048, 2048),
    ("decode gate_proj", 1, 2048, 8192),
    ("decode down_proj", 1, 8192, 2048),
    ("demo stack 24 rows", 24, 1024, 1024),
    ("batched 32 gate_proj", 32, 2048, 8192),
    ("batched 64 gate_proj", 64, 2048, 8192),
    ("prefill 265 gate_proj", 265, 2048, 8192),
    ("prefill 265 down_proj", 265, 8192, 2048),
    ("prefill 265 q_proj", 265, 2048, 2048),
    ("minilm 32x40 fc1", 1280, 384, 1536),
];

fn seconds_best(repeats: usize, mut run: impl FnMut()) -> f64 {
    run();
    (0..repeats)
        .map(|_| {
            let started = Instant::now();
            run();
            started.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let compute_dtype = arguments
        .iter()
        .find_map(|argument| ComputeDtype::parse(argument))
        .unwrap_or_default();
    let only_attention = arguments.iter().any(|argument| argument == "attention");
    let only_minilm = arguments.iter().any(|argument| argument == "minilm");
    let threads: Vec<usize> = arguments
        .iter()
        .filter_map(|argument| argument.parse().ok())
        .collect();
    let threads = if threads.is_empty() {
        vec![1, cores]
    } else {
        threads
    };
    for count in threads {
        let compute = CpuCompute::with_threads(count).with_compute_dtype(compute_dtype);
        println!(
            "## {} compute threads, compute_dtype {}",
            compute.threads(),
            compute_dtype.name()
        );
        if only_minilm {
            minilm_layer(&compute)?;
            continue;
        }
        let dtypes = if only_attention {
            &[][..]
        } else {
            &[DType::Bf16, DType::F8E4M3, DType::F32][..]
        };
        for &dtype in dtypes {
            for (what, rows, inner, out) in PRODUCTS {
                let values: Vec<f32> = (0..out * inner)
                    .map(|i| ((i % 251) as f32 - 125.0) * 1e-3)
                    .collect();
                let block = compute.load_block(&dtype.encode(&values))?;
                let view = compute.block_view(&block);
                let weight = view.weight(&TensorSlot::new(0, dtype, out, inner))?;
                let mut x = compute.tensor(rows, inner)?;
                compute.write(&mut x, &vec![0.01; rows * inner])?;
                let mut y = compute.tensor(rows, out)?;
                let seconds = seconds_best(5, || {
                    compute.linear(&x, &weight, None, &mut y).expect("linear");
                });
                let bytes = (out * inner * dtype.size_bytes()) as f64;
                let flops = 2.0 * (rows * inner * out) as f64;
                println!(
                    "{dtype:>8} {what:<24} {:8.3} ms  {:6.1} GB/s of weight  {:6.1} GFLOP/s",
                    seconds * 1e3,
                    bytes / seconds / 1e9,
                    flops / seconds / 1e9
                );
            }
        }
        // (what, tokens, heads, K/V heads, head width)
        for (what, length, heads, kv_heads, head_dim) in [
            ("prefill 265 attention", 265, 32, 8, 64),
            ("minilm 32x40 attention", 40, 12, 12, 32),
        ] {
            let sequences = if heads == 12 { 32 } else { 1 };
            let rows = sequences * length;
            let mut q = compute.tensor(rows, heads * head_dim)?;
            compute.write(&mut q, &vec![0.01; rows * heads * head_dim])?;
            let mut k = compute.tensor(rows, kv_heads * head_dim)?;
            compute.write(&mut k, &vec![0.02; rows * kv_heads * head_dim])?;
            let v = k.clone();
            let mut out = compute.tensor(rows, heads * head_dim)?;
            let lengths = vec![length; sequences];
            let mask = if heads == 12 {
                Mask::Padding(&lengths)
            } else {
                Mask::Causal
            };
            let shape = Attention {
                sequences,
                sequence_length: length,
                heads,
                kv_heads,
                head_dim,
                scale: 0.125,
                mask,
            };
            let repeats = if only_attention { 500 } else { 5 };
            let seconds = seconds_best(repeats, || {
                compute
                    .attention(&q, &k, &v, &shape, &mut out)
                    .expect("attention");
            });
            println!("     f32 {what:<24} {:8.3} ms", seconds * 1e3);
        }
        if only_attention {
            continue;
        }
        // What `verify = weights` pays per landed block: one checksum pass over it
        // (64 MiB: from memory; 6 MiB, a MiniLM layer: from the caches).
        for mebibytes in [64usize, 6] {
            let landed = compute.load_block(&vec![0x5a_u8; mebibytes << 20])?;
            let view = compute.block_view(&landed);
            let seconds = seconds_best(5, || {
                compute.checksum(&view).expect("checksum");
            });
            println!(
                "   bytes {:<24} {:8.3} ms  {:6.1} GB/s",
                format!("checksum of {mebibytes} MiB"),
                seconds * 1e3,
                (mebibytes << 20) as f64 / seconds / 1e9
            );
        }
    }
    Ok(())
}

/// One all-MiniLM-L6-v2 layer (hidden 384, 12 heads × 32, intermediate 1536, f32) on
/// 32 sequences of 40 tokens: each operation as the encoder calls it, best of 50.
fn minilm_layer(compute: &CpuCompute) -> Result<(), Box<dyn std::error::Error>> {
    const REPEATS: usize = 50;
    let (sequences, length, hidden, intermediate) = (32, 40, 384, 1536);
    let rows = sequences * length;
    let values = |count: usize| -> Vec<f32> {
        (0..count)
            .map(|i| ((i % 251) as f32 - 125.0) * 1e-3)
            .collect()
    };
    // One block: the square weight, fc1, fc2, then the biases and norm vectors.
    let layout = [
        (hidden, hidden),
        (intermediate, hidden),
        (hidden, intermediate),
        (1, hidden),
        (1, intermediate),
    ];
    let mut bytes = Vec::new();
    let mut slots = Vec::new();
    for (out, inner) in layout {
        slots.push(TensorSlot::new(bytes.len() as u64, DType::F32, out, inner));
        bytes.extend_from_slice(&DType::F32.encode(&values(out * inner)));
    }
    let block = compute.load_block(&bytes)?;
    let view = compute.block_view(&block);
    let [square, fc1, fc2, bias, wide_bias] = [0, 1, 2, 3, 4].map(|i| view.weight(&slots[i]));
    let (square, fc1, fc2, bias, wide_bias) = (square?, fc1?, fc2?, bias?, wide_bias?);
    let tensor = |cols: usize| -> Result<_, Box<dyn std::error::Error>> {
        let mut tensor = compute.tensor(rows, cols)?;
        compute.write(&mut tensor, &values(rows * cols))?;
        Ok(tensor)
    };
    let (x, mut y, mut wide) = (tensor(hidden)?, tensor(hidden)?, tensor(intermediate)?);
    let (mut q, mut normed) = (tensor(hidden)?, tensor(hidden)?);
    let lengths = vec![length; sequences];
    let shape = Attention {
        sequences,
        sequence_length: length,
        heads: 12,
        kv_heads: 12,
        head_dim: 32,
        scale: 1.0 / 32f32.sqrt(),
        mask: Mask::Padding(&lengths),
    };
    let mut total_seconds = 0.0;
    let mut time = |what: &str, times: usize, run: &mut dyn FnMut()| {
        let seconds = seconds_best(REPEATS, run);
        total_seconds += seconds * times as f64;
        println!("{what:<34} {:8.3} ms × {times}", seconds * 1e3);
    };
    time("q/k/v/o 384 → 384 + bias", 4, &mut || {
        compute
            .linear(&x, &square, Some(&bias), &mut y)
            .expect("linear");
    });
    time("attention, 12 heads × 32", 1, &mut || {
        compute
            .attention(&x, &x, &x, &shape, &mut q)
            .expect("attention");
    });
    time("add (residual)", 2, &mut || {
        compute.add(&mut y, &x).expect("add")
    });
    time("layer_norm", 2, &mut || {
        compute
            .layer_norm(&y, &bias, &bias, 1e-12, &mut normed)
            .expect("layer_norm");
    });
    time("fc1 384 → 1536 + bias", 1, &mut || {
        compute
            .linear(&x, &fc1, Some(&wide_bias), &mut wide)
            .expect("linear");
    });
    time("gelu (erf)", 1, &mut || {
        compute.gelu_erf(&mut wide).expect("gelu")
    });
    time("fc2 1536 → 384 + bias", 1, &mut || {
        compute
            .linear(&wide, &fc2, Some(&bias), &mut y)
            .expect("linear");
    });
    println!("{:<34} {:8.3} ms", "one layer", total_seconds * 1e3);
    Ok(())
}
