//! The attention kernel's bits on every lane implementation.
use super::*;

/// Attention of `heads` on lanes `L`, one task after another on this thread.
fn attention_on<L: Lanes>(heads: &Heads<'_>) -> Vec<f32> {
    let mut out = vec![0f32; heads.q.len()];
    let output = SharedOut::new(&mut out);
    let mut buffer = Vec::new();
    for task in 0..heads.sequences * heads.kv_heads {
        // SAFETY: one thread writes every task's rows; the lanes are this CPU's
        // (the caller checks `Isa::detect`).
        unsafe { one_task::<L>(heads, task, &mut buffer, output) };
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
fn on_avx512(heads: &Heads<'_>) -> Vec<f32> {
    attention_on::<Avx512>(heads)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn on_avx2(heads: &Heads<'_>) -> Vec<f32> {
    attention_on::<Avx2>(heads)
}

fn seeded(count: usize, seed: u32) -> Vec<f32> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn every_lane_implementation_gives_the_same_bits() {
    // Proves the fused multiply-adds give one result on the portable, AVX2 and
    // AVX-512 lanes: causal with grouped heads over three key tiles and a head
    // width with a tail past its whole rows of lanes (40), and a padding mask.
    for (dim, keys, causal) in [(40usize, 150usize, true), (32, 23, false)] {
        let (heads_count, kv_heads, sequences) = (4, 2, 2);
        let q = seeded(sequences * keys * heads_count * dim, 1);
        let k = seeded(sequences * keys * kv_heads * dim, 2);
        let v = seeded(sequences * keys * kv_heads * dim, 3);
        let lengths = [keys, keys - 7];
        let visible = |sequence: usize, query: usize| {
            if causal {
                query + 1
            } else {
                lengths[sequence]
            }
        };
        let heads = Heads {
            q: &q,
            k: &k,
            v: &v,
            heads: heads_count,
            kv_heads,
            head_dim: dim,
            scale: 0.125,
            queries: keys,
            keys,
            visible: &visible,
            sequences,
        };
        let portable = attention_on::<Portable>(&heads);
        assert!(portable
            .iter()
            .all(|value| value.is_finite() && *value != 0.0));
        #[cfg(target_arch = "x86_64")]
        {
            let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let isa = Isa::detect();
            if isa != Isa::Portable {
                // SAFETY: AVX2 and FMA were detected.
                let avx2 = unsafe { on_avx2(&heads) };
                assert_eq!(bits(&avx2), bits(&portable), "AVX2, dim {dim}");
            }
            if isa == Isa::Avx512 {
                // SAFETY: AVX-512 was detected.
                let avx512 = unsafe { on_avx512(&heads) };
                assert_eq!(bits(&avx512), bits(&portable), "AVX-512, dim {dim}");
            }
        }
    }
}
