//! Cosine similarity of embeddings (what `embed` prints after the vectors).

/// Lanes of the dot products' partial sums: independent chains the compiler keeps in
/// one vector register, summed over the lanes in order at the end.
const LANES: usize = 8;

/// `a · b` in [`LANES`] partial sums (a fixed order: the same bits every time).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in a_chunks.zip(b_chunks) {
        for ((lane, a), b) in lanes.iter_mut().zip(a).zip(b) {
            *lane += a * b;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `a·b / (|a|·|b|)`, from the norms.
fn from_norms(a: &[f32], b: &[f32], norm_a: f32, norm_b: f32) -> f32 {
    dot(a, b) / (norm_a * norm_b).max(f32::MIN_POSITIVE)
}

/// Cosine similarity of two embeddings.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    from_norms(a, b, dot(a, a).sqrt(), dot(b, b).sqrt())
}

/// `table[i][j]` = [`cosine`]`(embeddings[i], embeddings[j])`, each norm computed
/// once (512 texts: 262 144 pairs).
pub fn similarity_table(embeddings: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let norms: Vec<f32> = embeddings.iter().map(|v| dot(v, v).sqrt()).collect();
    embeddings
        .iter()
        .zip(&norms)
        .map(|(a, &norm_a)| {
            embeddings
                .iter()
                .zip(&norms)
                .map(|(b, &norm_b)| from_norms(a, b, norm_a, norm_b))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_cosine_pair_by_pair() {
        // Proves the table's entries are `cosine` of each pair, bit for bit, that a
        // vector's similarity to itself is 1 and to its opposite −1, tails included.
        let vectors: Vec<Vec<f32>> = (0..4)
            .map(|seed| {
                (0..19)
                    .map(|i| ((i * 7 + seed * 3) % 11) as f32 - 5.0)
                    .collect()
            })
            .collect();
        let mut with_opposite = vectors.clone();
        with_opposite.push(vectors[0].iter().map(|x| -x).collect());
        let table = similarity_table(&with_opposite);
        for (i, a) in with_opposite.iter().enumerate() {
            for (j, b) in with_opposite.iter().enumerate() {
                assert_eq!(table[i][j].to_bits(), cosine(a, b).to_bits(), "{i}, {j}");
            }
            assert!((table[i][i] - 1.0).abs() < 1e-6);
        }
        assert!((table[0][4] + 1.0).abs() < 1e-6);
    }
}
