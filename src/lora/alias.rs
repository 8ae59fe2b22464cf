//! Modules an adapter may name that the model stores under other names, or split
//! otherwise: the same weights in another layout of the same model.
//!
//! Flux is the case in the wild: a checkpoint in the original layout fuses a block's
//! q, k and v into one `img_attn.qkv` weight where diffusers stores `attn.to_q`,
//! `attn.to_k`, `attn.to_v`, and trainers name their adapters for whichever layout they
//! trained on. The family that knows both layouts lists the other layout's modules as
//! [`LoraAlias`]es; the loader tries them after the model's own names, with the same
//! prefix rules (a PEFT name's leading components, a kohya prefix and flattening).
//!
//! An alias is a list of [`AliasPiece`]s in the order of the adapter's `B` rows: each
//! lays a run of `B`'s rows on a run of a base weight's output rows, with the module's
//! `A` unchanged (a low-rank update `B·A` restricted to some rows is those rows of `B`
//! times the same `A`). So a PEFT `to_q` on a fused qkv is one piece (B's rows on the
//! weight's first third: the update is zero on the other rows), a kohya fused qkv on
//! diffusers' pieces is three (its B's thirds on `to_q`, `to_k`, `to_v`), and a
//! weight whose halves the two layouts store in swapped order is two pieces on one
//! tensor.

/// A module of another layout and where its update lands in this model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraAlias {
    /// The module's dotted name in the other layout, without `.weight`
    /// (`transformer_blocks.0.attn.to_q`).
    pub module: String,
    /// Where its `B` rows land, in `B`'s row order; together they cover every row of
    /// `B` once.
    pub pieces: Vec<AliasPiece>,
}

/// `B`'s rows `b_first .. b_first + rows` patch the output rows
/// `first_row .. first_row + rows` of the model's weight `tensor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasPiece {
    /// The weight's tensor name in the model (`double_blocks.0.img_attn.qkv.weight`).
    pub tensor: String,
    pub b_first: usize,
    pub first_row: usize,
    pub rows: usize,
}

impl LoraAlias {
    /// Rows of the `B` an adapter of this module has.
    pub fn b_rows(&self) -> usize {
        self.pieces.iter().map(|piece| piece.rows).sum()
    }
}
