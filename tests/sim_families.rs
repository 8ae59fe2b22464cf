//! Descriptions of the real-model families (`simulate --model FOLDER`, every
//! `validate` row of them): each block carries the kernels one step of the family
//! calls, with the same FLOPs and weight bytes its GEMMs execute, and a decoder
//! carries the KV cache its run reserves.

mod common;

use std::path::{Path, PathBuf};

use common::decoder::tiny_decoder;
use common::encoder::tiny_bert;
use common::{assert_bad_input, stagehand};

use stagehand::compute::work::Kernel;
use stagehand::compute::DType;
use stagehand::families::llama::DecoderArch;
use stagehand::run::driver::Model;
use stagehand::run::{prepare_with, Extras, Prepared, WorkloadKind};
use stagehand::settings::Settings;
use stagehand::simulate::ModelDescription;

fn decoder_folder(dir: &Path, arch: DecoderArch) -> PathBuf {
    tiny_decoder(&dir.join(format!("{arch:?}")), arch, DType::F32, 7)
}

fn prepared(path: &Path, kind: WorkloadKind, batch: usize) -> Prepared {
    let extras = Extras {
        headers_only: kind == WorkloadKind::Decoder,
        ..Extras::default()
    };
    prepare_with(path, kind, batch, &Settings::default(), false, &extras).unwrap()
}

/// Σ over the blocks of one kind of figure of their (decode-step) kernels.
fn linear_sum(model: &ModelDescription, figure: fn(&Kernel) -> f64) -> f64 {
    model
        .blocks
        .iter()
        .flat_map(|block| &block.work.as_ref().unwrap().kernels)
        .filter(|kernel| matches!(kernel, Kernel::Linear { .. }))
        .map(figure)
        .sum()
}

#[test]
fn a_llama_decode_step_carries_the_gemvs_and_bytes_the_decoder_executes() {
    // Proves the kernels are the decoder's: their GEMM FLOPs are the decoder's own
    // FLOPs per token, and the weights they read plus the norm vectors are every
    // streamed byte (tied embeddings: the head's GEMV reads the table).
    let dir = tempfile::tempdir().unwrap();
    let path = decoder_folder(dir.path(), DecoderArch::Llama);
    let prepared = prepared(&path, WorkloadKind::Decoder, 1);
    let Model::Llama(decoder) = &prepared.workload.model else {
        panic!("a decoder");
    };
    let model = ModelDescription::from_prepared(&prepared, 1).unwrap();
    assert_eq!(model.blocks.len(), decoder.config.layers + 1);
    let flops = linear_sum(&model, Kernel::gemm_flops);
    assert_eq!(flops, decoder.flops_per_token());
    let weight_bytes = linear_sum(&model, |kernel| kernel.weight_bytes() as f64) as u64;
    let norms = (2 * decoder.config.layers + 1) as u64 * decoder.config.hidden as u64 * 4;
    assert_eq!(weight_bytes + norms, model.total_bytes());
    assert_eq!(model.total_bytes(), prepared.streamed_model_bytes());
    // Every layer runs its attention over the cache; the prefill differs (the prompt).
    for block in &model.blocks[..decoder.config.layers] {
        let work = block.work.as_ref().unwrap();
        let cached = |kernel: &&Kernel| matches!(kernel, Kernel::CachedAttention { .. });
        assert_eq!(work.kernels.iter().filter(cached).count(), 1);
        assert_ne!(block.first_step_work.as_ref(), Some(work));
    }
    // The KV cache: keys and values of every layer per token, the run's prompt.
    let kv = model.kv_cache.unwrap();
    assert_eq!(kv.bytes_per_token, decoder.kv_bytes_per_token());
    assert_eq!(kv.prompt_tokens, decoder.prompt.len() as u64);
    assert_eq!(kv.start_reserve_bytes(), prepared.activation_bytes(1));
}

#[test]
fn a_mixtral_layer_runs_its_router_and_top_k_experts() {
    // One token picks top_k experts: each runs a SwiGLU of three GEMVs, so the layer's
    // GEMM FLOPs are the decoder's per-token count with its router and top_k experts.
    let dir = tempfile::tempdir().unwrap();
    let path = decoder_folder(dir.path(), DecoderArch::Mixtral);
    let prepared = prepared(&path, WorkloadKind::Decoder, 1);
    let Model::Llama(decoder) = &prepared.workload.model else {
        panic!("a decoder");
    };
    let experts = decoder.config.experts.as_ref().unwrap();
    let model = ModelDescription::from_prepared(&prepared, 1).unwrap();
    // The decoder's count includes each layer's router.
    let flops = linear_sum(&model, Kernel::gemm_flops);
    assert_eq!(flops, decoder.flops_per_token());
    let silu = |kernel: &&Kernel| {
        matches!(
            kernel,
            Kernel::Elementwise {
                op: stagehand::compute::work::ElementOp::SiluMul,
                ..
            }
        )
    };
    let first = model.blocks[0].work.as_ref().unwrap();
    assert_eq!(first.kernels.iter().filter(silu).count(), experts.top_k);
}

#[test]
fn a_bert_step_carries_its_gemms_attention_and_the_encoders_flops() {
    // The 8 built-in sentences in one batch: the kernels' GEMM and attention FLOPs
    // are the encoder's own count for that batch, every layer attends once, and the
    // blocks are the ones the encoder streams.
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_bert(&dir.path().join("bert"), DType::F32);
    let prepared = prepared(&path, WorkloadKind::Encoder, 8);
    let Model::Bert(encoder) = &prepared.workload.model else {
        panic!("an encoder");
    };
    let model = ModelDescription::from_prepared(&prepared, 1).unwrap();
    assert_eq!(model.blocks.len(), encoder.config.layers + 1);
    assert_eq!(model.total_bytes(), prepared.streamed_model_bytes());
    let (sequences, length) = encoder.batch_shape(0);
    assert_eq!(model.tokens_per_step, (sequences * length) as u64);
    let kernels = || {
        model
            .blocks
            .iter()
            .flat_map(|block| &block.work.as_ref().unwrap().kernels)
    };
    let flops: f64 = kernels().map(Kernel::gemm_flops).sum();
    assert!(
        (flops - encoder.flops_per_step()).abs() < 1e-6 * flops,
        "{flops}"
    );
    let attentions = kernels()
        .filter(|kernel| matches!(kernel, Kernel::Attention { .. }))
        .count();
    assert_eq!(attentions, encoder.config.layers);
    assert!(model.kv_cache.is_none());
}

#[test]
fn simulate_describes_an_encoder_folder_at_tokens_per_step() {
    // `simulate --model BERT_FOLDER` runs on the encoder's description; a step too
    // large to describe is refused with the flag named.
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_bert(&dir.path().join("bert"), DType::F32);
    let output = stagehand()
        .args([
            "simulate",
            "--hardware",
            "rtx4090",
            "--steps",
            "3",
            "--json",
        ])
        .args(["--no-baselines", "--tokens-per-step", "600", "--model"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["model"], "bert", "{report}");
    let output = stagehand()
        .args(["simulate", "--hardware", "rtx4090", "--model"])
        .arg(&path)
        .args(["--tokens-per-step", "2000000"])
        .output()
        .unwrap();
    assert_bad_input(&output, &["--tokens-per-step 2000000", "at most"]);
}

#[test]
fn qwen_steps_carry_their_head_norms_routers_and_shared_experts() {
    // Proves the recorded kernels are the Qwen variants' own: their GEMM FLOPs equal
    // the decoder's count (routers, top-k experts of their own width, Qwen2-MoE's
    // shared expert and its gate), and a Qwen3 layer normalises q and k per head (two
    // RMSNorms more than a Llama layer).
    let dir = tempfile::tempdir().unwrap();
    let rms_norms = |model: &ModelDescription| {
        let first = model.blocks[0].work.as_ref().unwrap();
        first
            .kernels
            .iter()
            .filter(|kernel| {
                matches!(
                    kernel,
                    Kernel::Elementwise {
                        op: stagehand::compute::work::ElementOp::RmsNorm,
                        ..
                    }
                )
            })
            .count()
    };
    let mut norms = Vec::new();
    for arch in [
        DecoderArch::Llama,
        DecoderArch::Qwen3,
        DecoderArch::Qwen3Moe,
        DecoderArch::Qwen2Moe,
    ] {
        let path = decoder_folder(dir.path(), arch);
        let prepared = prepared(&path, WorkloadKind::Decoder, 1);
        let Model::Llama(decoder) = &prepared.workload.model else {
            panic!("a decoder");
        };
        let model = ModelDescription::from_prepared(&prepared, 1).unwrap();
        let flops = linear_sum(&model, Kernel::gemm_flops);
        assert_eq!(flops, decoder.flops_per_token(), "{arch:?}");
        assert_eq!(
            model.total_bytes(),
            prepared.streamed_model_bytes(),
            "{arch:?}"
        );
        norms.push(rms_norms(&model));
    }
    assert_eq!(norms, vec![2, 4, 4, 2], "RMSNorms of a layer's step");
}

#[test]
fn simulate_describes_a_decoder_folder_from_its_config_and_headers() {
    // Proves `simulate` takes a decoder folder (config.json and headers, no tensor data
    // read) and gives its figures in tokens/s.
    let dir = tempfile::tempdir().unwrap();
    for arch in [DecoderArch::Llama, DecoderArch::Mixtral] {
        let model = tiny_decoder(&dir.path().join(format!("{arch:?}")), arch, DType::Bf16, 11);
        let output = stagehand()
            .args([
                "simulate",
                "--hardware",
                "rtx3060-12gb",
                "--json",
                "--model",
            ])
            .arg(&model)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let text = report.to_string();
        assert!(text.contains("tokens/s"), "{arch:?}: {text}");
        assert_eq!(report["output"]["unit"], "token", "{arch:?}");
        assert_eq!(report["fits"], true, "{arch:?}");
    }
}
