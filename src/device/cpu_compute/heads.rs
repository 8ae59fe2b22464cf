//! Per-head RMSNorm (Qwen3's `q_norm` and `k_norm`): a plain loop over each head of
//! each row, summing in index order so every pass gives the same bits.

/// Each `head_dim` slice `v` of `x` becomes `v/√(mean(v²) + eps)·gamma`, in place.
pub(super) fn rms_norm_heads(x: &mut [f32], head_dim: usize, gamma: &[f32], eps: f32) {
    for head in x.chunks_exact_mut(head_dim) {
        let mean_square = head.iter().map(|value| value * value).sum::<f32>() / head_dim as f32;
        let scale = 1.0 / (mean_square + eps).sqrt();
        for (value, weight) in head.iter_mut().zip(gamma) {
            *value = *value * scale * weight;
        }
    }
}
