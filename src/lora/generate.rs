//! Writes seeded test adapters for the linear-stack demo model, in either naming.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::LoraError;
use crate::model::demo::DemoSpec;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoraNaming {
    Peft,
    Kohya,
}

/// What [`write_demo_lora`] writes.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoLora {
    pub rank: usize,
    pub seed: u64,
    pub naming: LoraNaming,
    /// Written as per-module `alpha` tensors; `None` leaves alpha = rank.
    pub alpha: Option<f32>,
    /// Patch every `every`-th layer of the model (1 = all).
    pub every: usize,
}

impl Default for DemoLora {
    fn default() -> Self {
        Self {
            rank: 8,
            seed: 11,
            naming: LoraNaming::Peft,
            alpha: Some(16.0),
            every: 1,
        }
    }
}

/// One module's factors, row-major: `a` is `[rank, in]`, `b` is `[out, rank]`.
struct Factors {
    module: String,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// Writes an adapter that patches the demo model's layers and returns its size.
pub fn write_demo_lora(path: &Path, spec: &DemoSpec, lora: &DemoLora) -> Result<u64, LoraError> {
    if lora.rank == 0 || lora.every == 0 {
        return Err(LoraError::RankZero {
            path: path.to_path_buf(),
            module: "(generator: rank and every must be at least 1)".to_string(),
        });
    }
    let dim = spec.dim as usize;
    let mut state = lora.seed ^ spec.seed;
    let mut next = |bound: f32| {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let unit = ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32;
        (unit * 2.0 - 1.0) * bound
    };
    let mut modules = Vec::new();
    let mut layer_number = 0usize;
    for block in 0..spec.blocks {
        for layer in 0..spec.layers_per_block {
            layer_number += 1;
            if (layer_number - 1) % lora.every != 0 {
                continue;
            }
            let base = DemoSpec::tensor_name(block, layer);
            let module = base.trim_end_matches(".weight").to_string();
            let a_bound = 1.0 / (dim as f32).sqrt();
            let b_bound = 0.5 / (lora.rank as f32).sqrt();
            let a = (0..lora.rank * dim).map(|_| next(a_bound)).collect();
            let b = (0..dim * lora.rank).map(|_| next(b_bound)).collect();
            modules.push(Factors { module, a, b });
        }
    }
    write_factors(path, lora, dim, &modules)
}

fn write_factors(
    path: &Path,
    lora: &DemoLora,
    dim: usize,
    modules: &[Factors],
) -> Result<u64, LoraError> {
    let io = |reason: String| LoraError::Io {
        path: path.to_path_buf(),
        reason,
    };
    let (down, up, prefix) = match lora.naming {
        LoraNaming::Peft => ("lora_A.weight", "lora_B.weight", "base_model.model."),
        LoraNaming::Kohya => ("lora_down.weight", "lora_up.weight", "lora_unet_"),
    };
    let key = |module: &str| match lora.naming {
        LoraNaming::Peft => format!("{prefix}{module}"),
        LoraNaming::Kohya => format!("{prefix}{}", module.replace('.', "_")),
    };
    let as_bytes = |values: &[f32]| -> Vec<u8> {
        values
            .iter()
            .flat_map(|value| value.to_le_bytes())
            .collect()
    };
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for factors in modules {
        let module = key(&factors.module);
        owned.push((
            format!("{module}.{down}"),
            vec![lora.rank, dim],
            as_bytes(&factors.a),
        ));
        owned.push((
            format!("{module}.{up}"),
            vec![dim, lora.rank],
            as_bytes(&factors.b),
        ));
        if let Some(alpha) = lora.alpha {
            owned.push((format!("{module}.alpha"), vec![], as_bytes(&[alpha])));
        }
    }
    let views = owned
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|view| (name.clone(), view))
                .map_err(|error| io(error.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|error| io(error.to_string()))?;
    }
    let metadata = HashMap::from([("stagehand.kind".to_string(), "demo-lora".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), path)
        .map_err(|error| io(error.to_string()))?;
    std::fs::metadata(path)
        .map(|meta| meta.len())
        .map_err(|error| io(error.to_string()))
}
