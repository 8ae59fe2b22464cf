//! An encoder run's outputs as one embedding per text, in the order the texts were
//! given: the steps embed texts sorted by length (see `tokens`), so their outputs are
//! put back with the encoder's order ([`Facts::output_order`]).
//!
//! [`Facts::output_order`]: crate::families::Facts::output_order

use std::collections::BTreeMap;

/// One embedding per text from the kept outputs of each step (keyed by step), in input
/// order: `order[k]` is the input position of the k-th embedding computed (empty: the
/// steps kept input order). `None` when the values do not divide into `texts`
/// embeddings (an interrupted run).
pub fn embeddings_in_input_order(
    outputs: &BTreeMap<u64, Vec<f32>>,
    texts: usize,
    order: &[usize],
) -> Option<Vec<Vec<f32>>> {
    let all: Vec<f32> = outputs.values().flatten().copied().collect();
    if texts == 0 || all.is_empty() || all.len() % texts != 0 {
        return None;
    }
    let width = all.len() / texts;
    let computed = all.chunks_exact(width).map(<[f32]>::to_vec);
    if order.len() != texts {
        return Some(computed.collect());
    }
    let mut placed = vec![Vec::new(); texts];
    for (embedding, &position) in computed.zip(order) {
        *placed.get_mut(position)? = embedding;
    }
    Some(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_of_sorted_batches_come_back_in_input_order() {
        // Proves the k-th computed embedding lands at input position order[k], across steps.
        let outputs = BTreeMap::from([(0, vec![2.0, 2.5, 0.0, 0.5]), (1, vec![1.0, 1.5])]);
        let placed = embeddings_in_input_order(&outputs, 3, &[2, 0, 1]).unwrap();
        assert_eq!(placed, vec![vec![0.0, 0.5], vec![1.0, 1.5], vec![2.0, 2.5]]);
        assert_eq!(embeddings_in_input_order(&outputs, 4, &[]), None);
    }
}
