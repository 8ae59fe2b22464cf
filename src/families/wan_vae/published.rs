//! What a WAN VAE's single file cannot say and the published VAEs do: the per-channel
//! means and standard deviations a pipeline's latent is normalised with
//! (`latents_mean`, `latents_std` of `vae/config.json`), one set per published VAE,
//! told apart by their latent channels.

/// Wan 2.1's VAE (16 channels; Wan 2.1 and the Wan 2.2 A14B pipelines): diffusers'
/// `AutoencoderKLWan` defaults (0.42.1), the values every Wan-AI `*-Diffusers`
/// pipeline's `vae/config.json` carries.
pub const WAN21_LATENTS_MEAN: [f64; 16] = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
    -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
];
pub const WAN21_LATENTS_STD: [f64; 16] = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
    1.6382, 1.1253, 2.8251, 1.916,
];

/// Wan 2.2's VAE (48 channels; TI2V-5B): `vae22_diffusers_config` of diffusers'
/// `scripts/convert_wan_to_diffusers.py`, as Wan2.2-TI2V-5B-Diffusers' `vae/config.json`
/// and ComfyUI's `latent_formats.Wan22` give them
/// (`scripts/make-wan-vae-file-fixtures.py` checks them against the script).
pub const WAN22_LATENTS_MEAN: [f64; 48] = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813,
    0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108,
    -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313,
    -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944,
    0.3573, -0.0548, -0.1681, -0.0667,
];
pub const WAN22_LATENTS_STD: [f64; 48] = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
];

/// The published means and standard deviations of a VAE of `z_dim` latent channels
/// (as `config.json` writes them, f64: read as a folder's are, to the same f32);
/// `None` for a size no published WAN VAE has.
pub fn latents_statistics(z_dim: usize) -> Option<(&'static [f64], &'static [f64])> {
    match z_dim {
        16 => Some((&WAN21_LATENTS_MEAN, &WAN21_LATENTS_STD)),
        48 => Some((&WAN22_LATENTS_MEAN, &WAN22_LATENTS_STD)),
        _ => None,
    }
}
