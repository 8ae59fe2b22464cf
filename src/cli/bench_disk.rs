//! `stagehand bench disk FILE`: how fast each read path gets a file off the disk, in one
//! run, against `dd iflag=direct` as the reference.
//!
//! Modes, in this order: `dd if=FILE of=/dev/null bs=8M iflag=direct` (run by the bench),
//! O_DIRECT through the staging ring (the `--fast-disk` path), buffered `pread` through
//! the same ring from a cold page cache, and mmap-and-touch from a cold page cache.
//! Ratios to dd are what to compare: absolute figures drift on shared machines. For
//! each mode the bench reports our RSS growth and the system's page-cache growth
//! (`Cached` in /proc/meminfo, which other processes also move).

use std::path::PathBuf;

use anyhow::anyhow;
use bytesize::ByteSize;

use stagehand_actors::Bytes;

use super::progress::Status;
use super::{CommandResult, Failure};
use stagehand::settings::IO_ALIGN_BYTES;
use stagehand::storage::{
    drop_page_cache, DirectStorage, PreadStorage, StorageFile, StorageOptions,
};

mod modes;
mod report;

use modes::{make_cold, measure_mmap, measure_ring, run_dd};
use report::{finish_report, median_per_mode, print_table, ModeResult};

#[derive(Debug, clap::Args)]
pub struct BenchDiskArgs {
    /// File to read. It must exist: the bench never creates one. Use a file of ≥ 1 GiB on
    /// the disk you want to measure (tmpfs measures RAM, not a disk).
    pub file: PathBuf,
    /// Bytes to read from the start of the file (default: all of it), e.g. "1GiB".
    #[arg(long)]
    pub size: Option<ByteSize>,
    /// Size of one read request of the pread and O_DIRECT modes.
    #[arg(long, default_value = "4MiB")]
    pub request_size: ByteSize,
    /// Staging buffers in the ring.
    #[arg(long, default_value_t = 3)]
    pub staging_buffers: u32,
    /// Size of each staging buffer.
    #[arg(long, default_value = "64MiB")]
    pub staging_buffer_size: ByteSize,
    /// Reader worker threads of the pread and O_DIRECT modes.
    #[arg(long, default_value_t = 4)]
    pub reader_threads: u32,
    /// Passes over all modes; each figure is the median round (ratios: median of the
    /// per-round ratios), which tames the drift of a shared machine.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn execute(args: BenchDiskArgs) -> CommandResult {
    let file_bytes = check_input(&args)?;
    let bytes = args.size.map_or(file_bytes, |size| size.as_u64());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| Failure::run_failed(anyhow!("cannot start a runtime: {error}")))?;
    let storage_file = StorageFile {
        path: args.file.clone(),
        expected_bytes: file_bytes,
    };
    let options = StorageOptions {
        reader_threads: args.reader_threads as usize,
        read_request_bytes: args.request_size.as_u64(),
        ..StorageOptions::default()
    };
    options.validate().map_err(|error| {
        Failure::bad_input(anyhow!(
            "{error} (set by --request-size / --reader-threads here)"
        ))
    })?;

    let status = Status::start(format!(
        "bench disk: {} rounds over {}",
        args.rounds,
        Bytes(bytes)
    ));
    let mut rounds = Vec::with_capacity(args.rounds as usize);
    for round in 0..args.rounds {
        let progress = |mode: &str| {
            status.set_message(format!("round {} of {}: {mode}", round + 1, args.rounds));
        };
        rounds.push(run_round(
            &runtime,
            &args,
            &storage_file,
            &options,
            bytes,
            &progress,
        )?);
    }
    drop(status);
    // Leave the machine's page cache as we found it, as far as this file goes.
    let _ = drop_page_cache(&args.file, 0, 0);

    let modes = median_per_mode(rounds);
    let report = finish_report(&args, bytes, modes);
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|error| Failure::run_failed(anyhow!("cannot write JSON: {error}")))?;
        println!("{text}");
    } else {
        print_table(&report);
    }
    Ok(())
}

/// One pass over every mode, dd first, each cold mode after a page-cache drop.
fn run_round(
    runtime: &tokio::runtime::Runtime,
    args: &BenchDiskArgs,
    storage_file: &StorageFile,
    options: &StorageOptions,
    bytes: u64,
    progress: &dyn Fn(&str),
) -> Result<Vec<ModeResult>, Failure> {
    let file_bytes = storage_file.expected_bytes;
    let files = std::slice::from_ref(storage_file);
    progress("dd iflag=direct (the reference)");
    let dd = run_dd(&args.file, bytes, file_bytes)
        .map_err(|error| Failure::run_failed(anyhow!(error)))?;
    let mut modes = vec![dd];
    progress("O_DIRECT through the staging ring");

    let direct = DirectStorage::open(files, options).map_err(Failure::run_failed)?;
    let mut direct_result = measure_ring(runtime, &direct, "o_direct_ring", bytes, args)
        .map_err(Failure::run_failed)?;
    if !direct.is_direct() {
        direct_result
            .notes
            .push("O_DIRECT refused by the filesystem: this is a buffered read".to_string());
    }
    drop(direct);
    modes.push(direct_result);

    progress("buffered pread, cold page cache");
    let pread = PreadStorage::open(files, options).map_err(Failure::run_failed)?;
    let cold_note = make_cold(&args.file, file_bytes);
    let mut pread_result =
        measure_ring(runtime, &pread, "pread_cold", bytes, args).map_err(Failure::run_failed)?;
    pread_result.notes.extend(cold_note);
    drop(pread);
    modes.push(pread_result);

    progress("mmap and touch, cold page cache");
    let cold_note = make_cold(&args.file, file_bytes);
    let mut mmap_result = measure_mmap(&args.file, bytes).map_err(Failure::run_failed)?;
    mmap_result.notes.extend(cold_note);
    modes.push(mmap_result);

    // Ratios within the round: dd and the others saw the same machine state.
    let dd_gb_per_second = modes
        .first()
        .filter(|dd| dd.bytes > 0 && dd.gb_per_second > 0.0)
        .map(|dd| dd.gb_per_second);
    for mode in &mut modes {
        mode.ratio_to_dd = dd_gb_per_second.map(|dd| mode.gb_per_second / dd);
    }
    Ok(modes)
}

/// O_DIRECT reads whole aligned blocks: dd (iflag=direct) fails on a range that ends
/// mid-block, and the figures would not be comparable.
fn check_aligned_size(size: u64) -> Result<(), Failure> {
    if size % IO_ALIGN_BYTES == 0 {
        return Ok(());
    }
    const MIB: u64 = 1 << 20;
    let suggestion = if size >= MIB {
        format!("{}MiB", size / MIB)
    } else {
        format!(
            "{}KiB",
            (size / IO_ALIGN_BYTES).max(1) * (IO_ALIGN_BYTES / 1024)
        )
    };
    Err(Failure::bad_input(anyhow!(
        "--size {size} bytes is not a multiple of {}: O_DIRECT reads whole {} blocks (and \"G\"/\"GB\" are decimal); use e.g. --size {suggestion}",
        Bytes(IO_ALIGN_BYTES),
        Bytes(IO_ALIGN_BYTES)
    )))
}

/// The file must exist and be a non-empty regular file at least `--size` long, and
/// hold at least one read request.
fn check_input(args: &BenchDiskArgs) -> Result<u64, Failure> {
    let path = &args.file;
    let metadata = std::fs::metadata(path).map_err(|error| {
        Failure::bad_input(anyhow!(
            "{}: {error}; `bench disk` measures an existing file and creates none \
             (make one with e.g. `dd if=/dev/urandom of={} bs=1M count=1024`)",
            path.display(),
            path.display()
        ))
    })?;
    if !metadata.is_file() || metadata.len() == 0 {
        return Err(Failure::bad_input(anyhow!(
            "{}: not a non-empty regular file",
            path.display()
        )));
    }
    if let Some(size) = args.size {
        if size.as_u64() == 0 || size.as_u64() > metadata.len() {
            return Err(Failure::bad_input(anyhow!(
                "--size {} must be between 1 byte and the file's {}",
                Bytes(size.as_u64()),
                Bytes(metadata.len())
            )));
        }
        check_aligned_size(size.as_u64())?;
    }
    let bytes = args.size.map_or(metadata.len(), |size| size.as_u64());
    let request = args.request_size.as_u64();
    if bytes < request {
        return Err(Failure::bad_input(anyhow!(
            "{}: {} is less than one read request (--request-size {}): a figure from it would measure latency, not throughput; bench a file of at least {} (1 GiB or more on the disk to measure)",
            path.display(),
            Bytes(bytes),
            Bytes(request),
            Bytes(request)
        )));
    }
    if args.rounds == 0 || args.rounds > 100 {
        return Err(Failure::bad_input(anyhow!(
            "--rounds must be between 1 and 100"
        )));
    }
    check_ring(args)?;
    Ok(metadata.len())
}

/// The staging ring is allocated whole before the first read: bounded in count like
/// the runs' ring (64), in size by what the machine can spare (half its available RAM;
/// 1000 buffers of the default 64 MiB got the bench killed for memory), aligned for
/// O_DIRECT.
fn check_ring(args: &BenchDiskArgs) -> Result<(), Failure> {
    const MAX_STAGING_BUFFERS: u32 = 64;
    let size = args.staging_buffer_size.as_u64();
    if !(1..=MAX_STAGING_BUFFERS).contains(&args.staging_buffers) || size < IO_ALIGN_BYTES {
        return Err(Failure::bad_input(anyhow!(
            "--staging-buffers must be between 1 and {MAX_STAGING_BUFFERS} and --staging-buffer-size at least 4KiB"
        )));
    }
    if size % IO_ALIGN_BYTES != 0 {
        return Err(Failure::bad_input(anyhow!(
            "--staging-buffer-size {}: not a multiple of 4 KiB (O_DIRECT reads whole blocks)",
            Bytes(size)
        )));
    }
    let ring = u64::from(args.staging_buffers) * size;
    let spare = stagehand::os::available_ram_bytes().map(|available| available / 2);
    if let Some(spare) = spare.filter(|spare| ring > *spare) {
        return Err(Failure::bad_input(anyhow!(
            "a staging ring of {} (--staging-buffers {} × --staging-buffer-size {}) is more than half the available RAM ({}); use fewer or smaller buffers",
            Bytes(ring),
            args.staging_buffers,
            Bytes(size),
            Bytes(spare)
        )));
    }
    Ok(())
}
