//! The shape checks of every operation, made the same way by every adapter: a
//! family's bug or a malformed model is reported identically on every device.
//! `(rows, cols)` of a tensor are [`Dims`].

use super::{Attention, CachedAttention, ComputeError, LowRank, Mask, Weight};

/// `(rows, cols)` of a tensor.
pub type Dims = (usize, usize);

fn fail(what: &str, detail: String) -> Result<(), ComputeError> {
    Err(ComputeError::Shape(format!("{what}: {detail}")))
}

/// `rows × cols` f32 values, or the error an impossibly large activation gets.
pub fn elements(rows: usize, cols: usize) -> Result<usize, ComputeError> {
    rows.checked_mul(cols)
        .filter(|count| count.checked_mul(4).is_some())
        .ok_or_else(|| {
            ComputeError::OutOfMemory(format!(
                "an activation of {rows} × {cols} f32 does not fit in memory; lower --batch"
            ))
        })
}

pub fn same(what: &str, a: Dims, b: Dims) -> Result<(), ComputeError> {
    if a != b {
        return fail(what, format!("[{}, {}] vs [{}, {}]", a.0, a.1, b.0, b.1));
    }
    Ok(())
}

/// `y ← x·Wᵀ`: `x` is `[rows, in]`, `W` `[out, in]`, `y` `[rows, out]`.
pub fn linear(x: Dims, weight: &Weight<'_>, y: Dims) -> Result<(), ComputeError> {
    let (out, input) = (weight.rows(), weight.cols());
    if x.1 != input || y != (x.0, out) {
        return fail(
            "linear",
            format!(
                "x [{}, {}] · W[{out}, {input}]ᵀ into y [{}, {}]",
                x.0, x.1, y.0, y.1
            ),
        );
    }
    Ok(())
}

/// A vector weight (bias, norm) of `expected` elements.
pub fn vector(what: &str, weight: &Weight<'_>, expected: usize) -> Result<(), ComputeError> {
    if weight.elements() != expected {
        return fail(
            what,
            format!("{} elements, expected {expected}", weight.elements()),
        );
    }
    Ok(())
}

/// `y ← y + s·(x·Aᵀ)·Bᵀ`.
pub fn low_rank(x: Dims, factors: &LowRank<'_>, y: Dims) -> Result<(), ComputeError> {
    let (rank, input, out) = (
        factors.rank(),
        factors.in_features(),
        factors.out_features(),
    );
    if x.1 != input || y != (x.0, out) {
        return fail(
            "LoRA",
            format!(
                "x [{}, {}] with A [{rank}, {input}], B [{out}, {rank}] into y [{}, {}]",
                x.0, x.1, y.0, y.1
            ),
        );
    }
    Ok(())
}

/// `W ← W + s·B·A`.
pub fn merge(weight: &Weight<'_>, factors: &LowRank<'_>) -> Result<(), ComputeError> {
    if (weight.rows(), weight.cols()) != (factors.out_features(), factors.in_features()) {
        return fail(
            "LoRA merge",
            format!(
                "W [{}, {}] with B·A [{}, {}]",
                weight.rows(),
                weight.cols(),
                factors.out_features(),
                factors.in_features()
            ),
        );
    }
    Ok(())
}

pub fn scaled_rows(acc: Dims, y: Dims, scales: usize) -> Result<(), ComputeError> {
    same("add_scaled_rows", acc, y)?;
    if scales != acc.0 {
        return fail(
            "add_scaled_rows",
            format!("{scales} scales for {} rows", acc.0),
        );
    }
    Ok(())
}

/// An embedding lookup: one id per output row, each inside the table.
pub fn gather(table: &Weight<'_>, ids: &[u32], out: Dims) -> Result<(), ComputeError> {
    if ids.len() != out.0 || table.cols() != out.1 {
        return fail(
            "embedding lookup",
            format!(
                "{} ids from a [{}, {}] table into [{}, {}]",
                ids.len(),
                table.rows(),
                table.cols(),
                out.0,
                out.1
            ),
        );
    }
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= table.rows()) {
        return fail(
            "embedding lookup",
            format!("id {id} is outside a table of {} rows", table.rows()),
        );
    }
    Ok(())
}

pub fn rope(
    x: Dims,
    heads: usize,
    head_dim: usize,
    positions: usize,
    frequencies: usize,
) -> Result<(), ComputeError> {
    if x.1 != heads * head_dim
        || positions != x.0
        || head_dim % 2 != 0
        || frequencies != head_dim / 2
    {
        return fail(
            "rope",
            format!(
                "[{}, {}] with {heads} heads of {head_dim}, {positions} positions, {frequencies} frequencies",
                x.0, x.1
            ),
        );
    }
    Ok(())
}

/// Per-head RMSNorm of `x` with a `[head_dim]` weight: `x`'s columns are `heads`
/// heads of `head_dim`. Returns `head_dim`.
pub fn norm_heads(x: Dims, heads: usize, gamma: &Weight<'_>) -> Result<usize, ComputeError> {
    if heads == 0 || x.1 % heads != 0 || gamma.elements() != x.1 / heads {
        fail(
            "rms_norm_heads",
            format!(
                "[{}, {}] as {heads} heads with a weight of {} elements",
                x.0,
                x.1,
                gamma.elements()
            ),
        )?;
    }
    Ok(x.1 / heads)
}

/// `rows` written into `cache` from row `at`.
pub fn write_rows(cache: Dims, at: usize, rows: Dims) -> Result<(), ComputeError> {
    if rows.1 != cache.1 || at.checked_add(rows.0).is_none_or(|end| end > cache.0) {
        return fail(
            "write_rows",
            format!(
                "[{}, {}] at row {at} of a [{}, {}] cache",
                rows.0, rows.1, cache.0, cache.1
            ),
        );
    }
    Ok(())
}

/// `to` taken from `from` at row `first`.
pub fn slice_rows(from: Dims, first: usize, to: Dims) -> Result<(), ComputeError> {
    if from.1 != to.1 || first.checked_add(to.0).is_none_or(|end| end > from.0) {
        return fail(
            "slice_rows",
            format!(
                "rows {first}..{} of a [{}, {}] tensor into [{}, {}]",
                first.saturating_add(to.0),
                from.0,
                from.1,
                to.0,
                to.1
            ),
        );
    }
    Ok(())
}

fn heads(what: &str, heads: usize, kv_heads: usize) -> Result<(), ComputeError> {
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return fail(
            what,
            format!("{heads} query heads cannot share {kv_heads} key/value heads"),
        );
    }
    Ok(())
}

impl Attention<'_> {
    /// `q` `[sequences·length, heads·head_dim]`, `k` and `v` `[…, kv_heads·head_dim]`,
    /// padding lengths within the sequences.
    pub fn check(&self, q: Dims, k: Dims, v: Dims) -> Result<(), ComputeError> {
        heads("attention", self.heads, self.kv_heads)?;
        let rows = self.sequences * self.sequence_length;
        if q != (rows, self.heads * self.head_dim)
            || k != (rows, self.kv_heads * self.head_dim)
            || v != k
        {
            return fail(
                "attention",
                format!(
                    "q {q:?}, k {k:?}, v {v:?} for {} sequences of {} rows, {} heads ({} kv) of {}",
                    self.sequences, self.sequence_length, self.heads, self.kv_heads, self.head_dim
                ),
            );
        }
        if let Mask::Padding(lengths) = self.mask {
            if lengths.len() != self.sequences
                || lengths
                    .iter()
                    .any(|&length| length == 0 || length > self.sequence_length)
            {
                return fail(
                    "attention",
                    format!(
                        "padding lengths {lengths:?} for {} sequences of {} rows",
                        self.sequences, self.sequence_length
                    ),
                );
            }
        }
        Ok(())
    }
}

impl CachedAttention {
    /// `q` `[queries, heads·head_dim]`, caches of at least `past + queries` rows.
    pub fn check(&self, q: Dims, k: Dims, v: Dims) -> Result<(), ComputeError> {
        heads("cached attention", self.heads, self.kv_heads)?;
        let keys = self.past + self.queries;
        if q != (self.queries, self.heads * self.head_dim)
            || k.0 < keys
            || k.1 != self.kv_heads * self.head_dim
            || v != k
        {
            return fail(
                "cached attention",
                format!(
                    "q {q:?}, k {k:?}, v {v:?} for {} queries after {} cached rows",
                    self.queries, self.past
                ),
            );
        }
        Ok(())
    }
}
