//! How one adapter module's factors become targets: the weights its name was found
//! as (one of the model's, or the pieces of another layout's module), the factors'
//! shapes checked against them, and `B` split by rows between them with `A` whole.

use std::path::Path;

use super::load::Module;
use super::names::{BaseNames, Found};
use super::{LoraError, LoraTarget};
use crate::model::ModelIndex;

/// Where one module's update lands: `B`'s rows `b_first .. b_first + rows` on the
/// output rows `first_row ..` of weight `tensor`.
struct Destination {
    tensor: usize,
    b_first: usize,
    first_row: usize,
    rows: usize,
}

/// The weights `found` names, checked to be weights LoRA can patch.
fn destinations(
    index: &ModelIndex,
    bases: &BaseNames<'_>,
    found: Found<'_>,
    shape_error: &dyn Fn(String) -> LoraError,
) -> Result<Vec<Destination>, LoraError> {
    let planned = match found {
        Found::Own(tensor) => vec![(tensor, 0, 0, None)],
        Found::Alias(alias) => alias
            .pieces
            .iter()
            .map(|piece| {
                let tensor = bases.tensor(&piece.tensor).ok_or_else(|| {
                    shape_error(format!(
                        "names `{}` of another layout, whose weight `{}` this model lacks",
                        alias.module, piece.tensor
                    ))
                })?;
                Ok((tensor, piece.b_first, piece.first_row, Some(piece.rows)))
            })
            .collect::<Result<_, LoraError>>()?,
    };
    planned
        .into_iter()
        .map(|(tensor, b_first, first_row, rows)| {
            let base = &index.tensors[tensor];
            let [out_features, _] = base.shape[..] else {
                return Err(shape_error(format!(
                    "base tensor `{}` has shape {:?}; LoRA patches 2-D weights only",
                    base.name, base.shape
                )));
            };
            if base.dtype == "I8" {
                // Refused when resident blocks baked every patch: into int8 codes it
                // rounds to steps of max|w|/127 (most of a LoRA's update), and a 4-bit
                // group-quantized weight has no merge at all. Only F32 weights are
                // baked now (`lora_set::merges`); LoRA on integer weights is untested.
                return Err(shape_error(format!(
                    "base tensor `{}` is integer-quantized (int8_tensorwise or awq_w4a16), which stagehand does not patch with a LoRA (merged into its codes the update would round away); use a BF16 or FP8 checkpoint",
                    base.name
                )));
            }
            let rows = rows.unwrap_or(out_features);
            if first_row + rows > out_features {
                return Err(shape_error(format!(
                    "maps to rows {first_row}..{} of `{}`, which has {out_features}",
                    first_row + rows,
                    base.name
                )));
            }
            Ok(Destination {
                tensor,
                b_first,
                first_row,
                rows,
            })
        })
        .collect()
}

/// What the factors must patch, for messages: `name` [out, in], or each row run.
fn describe(index: &ModelIndex, found: Found<'_>, destinations: &[Destination]) -> String {
    match found {
        Found::Own(tensor) => {
            let base = &index.tensors[tensor];
            format!("`{}` {:?}", base.name, base.shape)
        }
        Found::Alias(alias) => {
            let runs: Vec<String> = destinations
                .iter()
                .map(|to| {
                    format!(
                        "`{}` rows {}..{}",
                        index.tensors[to.tensor].name,
                        to.first_row,
                        to.first_row + to.rows
                    )
                })
                .collect();
            format!("{} (for `{}`)", runs.join(", "), alias.module)
        }
    }
}

/// One module's factors on the weights `found` names: each weight gets its rows of
/// `B` and the whole `A`.
pub(super) fn targets(
    path: &Path,
    index: &ModelIndex,
    bases: &BaseNames<'_>,
    found: Found<'_>,
    module_name: &str,
    module: &Module,
    config_alpha: Option<f32>,
) -> Result<Vec<LoraTarget>, LoraError> {
    let missing = |present: &str, missing: &str| LoraError::MissingFactor {
        path: path.to_path_buf(),
        module: module_name.to_string(),
        present: present.to_string(),
        missing: missing.to_string(),
    };
    let (down_shape, down) = module
        .down
        .as_ref()
        .ok_or_else(|| missing("an up/B factor", "down/A factor"))?;
    let (up_shape, up) = module
        .up
        .as_ref()
        .ok_or_else(|| missing("a down/A factor", "up/B factor"))?;
    let shape_error = |problem: String| LoraError::Shape {
        path: path.to_path_buf(),
        key: module_name.to_string(),
        problem,
    };
    let destinations = destinations(index, bases, found, &shape_error)?;
    let ([rank, a_in], [b_out, b_rank]) = (&down_shape[..], &up_shape[..]) else {
        return Err(shape_error(format!(
            "factors must be 2-D, found A {down_shape:?} and B {up_shape:?}"
        )));
    };
    if *rank == 0 || *b_rank == 0 {
        return Err(LoraError::RankZero {
            path: path.to_path_buf(),
            module: module_name.to_string(),
        });
    }
    let out_features: usize = destinations.iter().map(|to| to.rows).sum();
    let Some(first) = destinations.first() else {
        return Err(shape_error("maps to no weight".to_string()));
    };
    let in_features = index.tensors[first.tensor].shape[1];
    let inputs_agree = destinations
        .iter()
        .all(|to| index.tensors[to.tensor].shape[1] == in_features);
    if !inputs_agree || rank != b_rank || *a_in != in_features || *b_out != out_features {
        return Err(shape_error(format!(
            "A {down_shape:?} · B {up_shape:?} does not patch {} (need A [rank, {in_features}] and B [{out_features}, rank])",
            describe(index, found, &destinations)
        )));
    }
    let alpha = module.alpha.or(config_alpha).unwrap_or(*rank as f32);
    check_finite(path, &format!("{module_name} alpha"), &[alpha])?;
    check_finite(path, &format!("{module_name} A"), down)?;
    check_finite(path, &format!("{module_name} B"), up)?;
    Ok(destinations
        .iter()
        .map(|to| {
            let base = &index.tensors[to.tensor];
            LoraTarget {
                tensor: to.tensor,
                base: base.name.clone(),
                block: base.block,
                block_offset: base.block_offset,
                first_row: to.first_row,
                out_features: to.rows,
                in_features,
                rank: *rank,
                alpha,
                a: down.clone(),
                b: up[to.b_first * rank..(to.b_first + to.rows) * rank].to_vec(),
                rslora: false,
            }
        })
        .collect())
}

fn check_finite(path: &Path, key: &str, values: &[f32]) -> Result<(), LoraError> {
    match values.iter().position(|value| !value.is_finite()) {
        None => Ok(()),
        Some(index) => Err(LoraError::NonFinite {
            path: path.to_path_buf(),
            key: key.to_string(),
            index,
            value: values[index],
        }),
    }
}
