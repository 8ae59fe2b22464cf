//! The sampler a pipeline folder's `scheduler/scheduler_config.json` names. Wan 2.2's
//! published folders name `UniPCMultistepScheduler` with flow sigmas ([`UniPc`]);
//! `FlowMatchEulerDiscreteScheduler` with a static `shift` is the other one computed
//! here ([`FlowEuler`]). Every key diffusers writes is known: one that changes the math
//! to something not computed here (Karras sigmas, dynamic shifting, thresholding,
//! stochastic sampling, an ε or v prediction) is refused by name, as is an unknown key.

mod euler;
mod solver;
mod unipc;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

pub use euler::{EulerConfig, FlowEuler};
pub use solver::{Solver, SolverConfig};
pub use unipc::{FinalSigma, UniPc, UniPcConfig, Variant};

/// A `scheduler_config.json` that is not one computed here, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct SchedulerConfigError {
    pub path: PathBuf,
    pub problem: String,
}

/// The keys of diffusers 0.42's `UniPCMultistepScheduler` config that leave the flow
/// schedule's math alone (the beta schedule is not used with flow sigmas).
const INERT_KEYS: &[&str] = &[
    "_class_name",
    "_diffusers_version",
    "beta_end",
    "beta_schedule",
    "beta_start",
    "dynamic_thresholding_ratio",
    "rescale_betas_zero_snr",
    "sample_max_value",
    "sigma_max",
    "sigma_min",
    "steps_offset",
    "time_shift_type",
    "timestep_spacing",
    "trained_betas",
];

/// The keys read here, with the value that means "off" for the ones refused when on.
const REFUSED_WHEN_SET: &[(&str, Value)] = &[
    ("thresholding", Value::Bool(false)),
    ("use_karras_sigmas", Value::Bool(false)),
    ("use_exponential_sigmas", Value::Bool(false)),
    ("use_beta_sigmas", Value::Bool(false)),
    ("use_dynamic_shifting", Value::Bool(false)),
    ("shift_terminal", Value::Null),
    ("solver_p", Value::Null),
];

const READ_KEYS: &[&str] = &[
    "disable_corrector",
    "final_sigmas_type",
    "flow_shift",
    "lower_order_final",
    "num_train_timesteps",
    "predict_x0",
    "prediction_type",
    "solver_order",
    "solver_type",
    "use_flow_sigmas",
];

/// The keys of diffusers 0.42's `FlowMatchEulerDiscreteScheduler` config that leave a
/// static shift's math alone (the dynamic shift's parameters).
const EULER_INERT_KEYS: &[&str] = &[
    "_class_name",
    "_diffusers_version",
    "base_image_seq_len",
    "base_shift",
    "max_image_seq_len",
    "max_shift",
    "time_shift_type",
];

/// Its keys read here, with the value that means "off" for the ones refused when on.
const EULER_REFUSED_WHEN_SET: &[(&str, Value)] = &[
    ("use_dynamic_shifting", Value::Bool(false)),
    ("invert_sigmas", Value::Bool(false)),
    ("shift_terminal", Value::Null),
    ("use_karras_sigmas", Value::Bool(false)),
    ("use_exponential_sigmas", Value::Bool(false)),
    ("use_beta_sigmas", Value::Bool(false)),
    ("stochastic_sampling", Value::Bool(false)),
];

const EULER_READ_KEYS: &[&str] = &["num_train_timesteps", "shift"];

/// The keys one scheduler class's config may hold.
struct Keys {
    inert: &'static [&'static str],
    read: &'static [&'static str],
    refused_when_set: &'static [(&'static str, Value)],
}

/// The sampler `scheduler_config.json` at `path` configures: UniPC or flow-matching Euler.
pub fn read_solver(path: &Path) -> Result<SolverConfig, SchedulerConfigError> {
    let (config, layout) = read_config(path)?;
    match class_of(&config) {
        "UniPCMultistepScheduler" => unipc_config(&config, &layout).map(SolverConfig::UniPc),
        "FlowMatchEulerDiscreteScheduler" => {
            euler_config(&config, &layout).map(SolverConfig::Euler)
        }
        class => Err(layout(format!(
            "_class_name is \"{class}\"; stagehand samples video with UniPCMultistepScheduler (flow sigmas, as the published Wan 2.2 folders configure it) or FlowMatchEulerDiscreteScheduler"
        ))),
    }
}

/// The UniPC solver `scheduler_config.json` at `path` configures.
pub fn read_unipc(path: &Path) -> Result<UniPcConfig, SchedulerConfigError> {
    let (config, layout) = read_config(path)?;
    let class = class_of(&config);
    if class != "UniPCMultistepScheduler" {
        return Err(layout(format!(
            "_class_name is \"{class}\", not UniPCMultistepScheduler"
        )));
    }
    unipc_config(&config, &layout)
}

type Layout = Box<dyn Fn(String) -> SchedulerConfigError>;

/// The JSON object at `path`, and the error maker that names it.
fn read_config(path: &Path) -> Result<(Map<String, Value>, Layout), SchedulerConfigError> {
    let owned = path.to_path_buf();
    let layout: Layout = Box::new(move |problem: String| SchedulerConfigError {
        path: owned.clone(),
        problem,
    });
    let text = std::fs::read_to_string(path).map_err(|error| {
        layout(format!(
            "cannot be read ({error}); give a scheduler's scheduler_config.json"
        ))
    })?;
    let config: Map<String, Value> = serde_json::from_str(&text)
        .map_err(|error| layout(format!("is not a JSON object ({error})")))?;
    Ok((config, layout))
}

fn class_of(config: &Map<String, Value>) -> &str {
    config
        .get("_class_name")
        .and_then(Value::as_str)
        .unwrap_or("(none)")
}

fn unipc_config(
    config: &Map<String, Value>,
    layout: &dyn Fn(String) -> SchedulerConfigError,
) -> Result<UniPcConfig, SchedulerConfigError> {
    let keys = Keys {
        inert: INERT_KEYS,
        read: READ_KEYS,
        refused_when_set: REFUSED_WHEN_SET,
    };
    check_keys(config, &keys, layout)?;
    solver_config(config, layout)
}

/// A static-shift flow-matching Euler's config (WanPipeline passes no `mu`).
fn euler_config(
    config: &Map<String, Value>,
    layout: &dyn Fn(String) -> SchedulerConfigError,
) -> Result<EulerConfig, SchedulerConfigError> {
    let keys = Keys {
        inert: EULER_INERT_KEYS,
        read: EULER_READ_KEYS,
        refused_when_set: EULER_REFUSED_WHEN_SET,
    };
    check_keys(config, &keys, layout)?;
    let number =
        |key: &str, default: f64| config.get(key).and_then(Value::as_f64).unwrap_or(default);
    let (train_timesteps, shift) = (number("num_train_timesteps", 1000.0), number("shift", 1.0));
    if train_timesteps < 1.0 || train_timesteps.fract() != 0.0 || shift.is_nan() || shift <= 0.0 {
        return Err(layout(format!(
            "\"num_train_timesteps\": {train_timesteps} and \"shift\": {shift} must be a whole number ≥ 1 and a positive number"
        )));
    }
    Ok(EulerConfig {
        train_timesteps: train_timesteps as usize,
        shift,
    })
}

/// Every key known, and none set to math not computed here.
fn check_keys(
    config: &Map<String, Value>,
    keys: &Keys,
    layout: &dyn Fn(String) -> SchedulerConfigError,
) -> Result<(), SchedulerConfigError> {
    for key in config.keys() {
        let known = keys.inert.contains(&key.as_str())
            || keys.read.contains(&key.as_str())
            || keys.refused_when_set.iter().any(|(name, _)| name == key);
        if !known {
            return Err(layout(format!("unknown key \"{key}\": stagehand does not know what it changes, so it does not guess")));
        }
    }
    for (key, off) in keys.refused_when_set {
        if config.get(*key).is_some_and(|value| value != off) {
            return Err(layout(format!(
                "\"{key}\": {} is not computed here (only {off})",
                config[*key]
            )));
        }
    }
    Ok(())
}

/// The solver the (checked) keys configure.
fn solver_config(
    config: &Map<String, Value>,
    layout: &dyn Fn(String) -> SchedulerConfigError,
) -> Result<UniPcConfig, SchedulerConfigError> {
    let flag =
        |key: &str, default: bool| config.get(key).and_then(Value::as_bool).unwrap_or(default);
    let text_of = |key: &str, default: &'static str| -> String {
        config
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_string()
    };
    if !flag("use_flow_sigmas", false) {
        return Err(layout(
            "\"use_flow_sigmas\" is not true: stagehand computes UniPC on flow sigmas only (Wan's)"
                .into(),
        ));
    }
    let prediction = text_of("prediction_type", "epsilon");
    if prediction != "flow_prediction" || !flag("predict_x0", true) {
        return Err(layout(format!(
            "\"prediction_type\": \"{prediction}\" with \"predict_x0\": {}: stagehand computes flow_prediction with predict_x0 only",
            flag("predict_x0", true)
        )));
    }
    let variant = match text_of("solver_type", "bh2").as_str() {
        "bh1" => Variant::Bh1,
        // diffusers takes the DPM-Solver names for bh2.
        "bh2" | "midpoint" | "heun" | "logrho" => Variant::Bh2,
        other => {
            return Err(layout(format!(
                "\"solver_type\": \"{other}\" is not bh1 or bh2"
            )))
        }
    };
    let final_sigma = match text_of("final_sigmas_type", "zero").as_str() {
        "zero" => FinalSigma::Zero,
        "sigma_min" => FinalSigma::SigmaMin,
        other => {
            return Err(layout(format!(
                "\"final_sigmas_type\": \"{other}\" is not zero or sigma_min"
            )))
        }
    };
    if variant == Variant::Bh1 && final_sigma == FinalSigma::Zero {
        // At σ = 0 the log-SNR is infinite and bh1's B(h) = h makes diffusers' last step NaN.
        return Err(layout("\"solver_type\": \"bh1\" with \"final_sigmas_type\": \"zero\" ends in NaN (B(h) = h at an infinite log-SNR); use bh2 or sigma_min".into()));
    }
    let number =
        |key: &str, default: f64| config.get(key).and_then(Value::as_f64).unwrap_or(default);
    let solver_order = number("solver_order", 2.0);
    let train_timesteps = number("num_train_timesteps", 1000.0);
    let flow_shift = number("flow_shift", 1.0);
    if !(1.0..=4.0).contains(&solver_order) || solver_order.fract() != 0.0 {
        return Err(layout(format!(
            "\"solver_order\": {solver_order} is not 1, 2, 3 or 4"
        )));
    }
    if train_timesteps < 1.0
        || train_timesteps.fract() != 0.0
        || flow_shift.is_nan()
        || flow_shift <= 0.0
    {
        return Err(layout(format!(
            "\"num_train_timesteps\": {train_timesteps} and \"flow_shift\": {flow_shift} must be a whole number ≥ 1 and a positive number"
        )));
    }
    let disable_corrector = match config.get("disable_corrector") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(steps)) => steps
            .iter()
            .map(|step| step.as_u64().map(|step| step as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| layout("\"disable_corrector\" is not a list of step indices".into()))?,
        Some(other) => {
            return Err(layout(format!(
                "\"disable_corrector\": {other} is not a list"
            )))
        }
    };
    Ok(UniPcConfig {
        train_timesteps: train_timesteps as usize,
        flow_shift,
        solver_order: solver_order as usize,
        variant,
        lower_order_final: flag("lower_order_final", true),
        disable_corrector,
        final_sigma,
    })
}

/// Whether a solver at step `index` of `steps` can take a step with an output of
/// `output` values on a sample of `sample`: a finished schedule, or an output of
/// another length, is an error (a solver never panics on what a model returned).
fn check_step(index: usize, steps: usize, output: usize, sample: usize) -> Result<(), String> {
    if index >= steps {
        return Err(format!("the schedule has {steps} steps, all taken"));
    }
    if output != sample {
        return Err(format!(
            "the model's output has {output} values, the sample {sample}"
        ));
    }
    Ok(())
}
