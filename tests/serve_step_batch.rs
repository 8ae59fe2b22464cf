//! The batched decoder step `stagehand serve` runs (`Decoder::step_batch`) against
//! each sequence's own `Family::step`: with sequences joining mid-way (a prefill beside
//! decodes), several in one stack of rows, and seeded sampling, every sequence's
//! logits at every step are bit for bit those it gets alone.

mod common;

use stagehand::compute::Compute;
use stagehand::compute::DType;
use stagehand::device::CpuCompute;
use stagehand::families::blocks::FromFiles;
use stagehand::families::llama::DecoderArch;
use stagehand::families::llama::{BatchSequence, Decoder, Sampling};
use stagehand::families::{Family, Model, WorkloadKind};
use stagehand::model::BlockReader;
use stagehand::run::prepare;
use stagehand::settings::Settings;

struct Case {
    prompt: Vec<u32>,
    sampling: Sampling,
    /// The round it joins the batch at.
    joins: usize,
}

fn cases() -> Vec<Case> {
    let greedy = Sampling::default();
    let sampled = Sampling {
        temperature: 0.8,
        top_p: 0.9,
        seed: 11,
    };
    let mut cases = vec![
        Case {
            prompt: vec![256, 10, 20],
            sampling: greedy,
            joins: 0,
        },
        Case {
            prompt: vec![256, 5],
            sampling: sampled,
            joins: 0,
        },
        Case {
            prompt: vec![256, 7, 8, 9, 30],
            sampling: greedy,
            joins: 2,
        },
    ];
    // More decoding sequences than one stack holds: two stacks in one step.
    for extra in 0..CpuCompute::new().stackable_rows() as u32 {
        cases.push(Case {
            prompt: vec![256, 40 + extra],
            sampling: greedy,
            joins: 1,
        });
    }
    cases
}

/// Each case's logits per step, alone.
fn alone(
    decoder: &mut Decoder,
    compute: &CpuCompute,
    blocks: &mut FromFiles<'_, CpuCompute>,
    steps: u64,
) -> Vec<Vec<Vec<f32>>> {
    cases()
        .iter()
        .map(|case| {
            decoder.prompt = case.prompt.clone();
            decoder.sampling = case.sampling;
            let mut state = decoder.start(compute).unwrap();
            (0..steps)
                .map(|step| {
                    decoder
                        .step(compute, &mut state, blocks, step)
                        .unwrap()
                        .output
                        .unwrap()
                })
                .collect()
        })
        .collect()
}

fn check(arch: DecoderArch) {
    let dir = tempfile::tempdir().unwrap();
    let folder = common::decoder::tiny_decoder(dir.path(), arch, DType::F32, 3);
    let settings = Settings::default();
    let mut prepared = prepare(&folder, WorkloadKind::Decoder, 1, &settings, false).unwrap();
    let reader = BlockReader::open(&prepared.index).unwrap();
    let layout = prepared.facts().layout().clone();
    let Model::Llama(decoder) = &mut prepared.workload.model else {
        panic!("a decoder");
    };
    let compute = CpuCompute::new();
    let mut blocks = FromFiles::new(&reader, &layout, None, false);
    let steps = 6;
    let expected = alone(decoder, &compute, &mut blocks, steps);
    let cases = cases();
    let mut states: Vec<_> = cases
        .iter()
        .map(|case| {
            decoder.prompt = case.prompt.clone();
            decoder.sampling = case.sampling;
            decoder.start(&compute).unwrap()
        })
        .collect();
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); cases.len()];
    for round in 0..steps as usize + 2 {
        let mut batch: Vec<BatchSequence<'_, CpuCompute>> = Vec::new();
        let mut who = Vec::new();
        for (index, (case, state)) in cases.iter().zip(states.iter_mut()).enumerate() {
            let step = round.checked_sub(case.joins);
            if let Some(step) = step.filter(|&step| step < steps as usize) {
                batch.push(BatchSequence {
                    state,
                    prompt: &case.prompt,
                    sampling: case.sampling,
                    step: step as u64,
                });
                who.push(index);
            }
        }
        let outputs = decoder
            .step_batch(&compute, &mut batch, &mut blocks)
            .unwrap();
        for (index, output) in who.into_iter().zip(outputs) {
            got[index].push(output.unwrap().output.unwrap());
        }
    }
    for (index, (got, expected)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(got.len(), expected.len());
        for (step, (got, expected)) in got.iter().zip(expected).enumerate() {
            assert!(
                got == expected,
                "{arch:?} sequence {index} step {step}: batched logits differ from alone"
            );
        }
    }
}

#[test]
fn a_batched_llama_step_gives_every_sequence_its_own_logits_bit_for_bit() {
    // Proves stacked rows, a prefill beside decodes and per-sequence sampling streams.
    check(DecoderArch::Llama);
}

#[test]
fn a_batched_qwen3_step_gives_every_sequence_its_own_logits_bit_for_bit() {
    // Proves the same with Qwen3's per-head q/k norms on stacked rows.
    check(DecoderArch::Qwen3);
}
