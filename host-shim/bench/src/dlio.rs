//! `dpuio bench unet3d`: DLIO's 3D U-Net workload (MLPerf Storage), scaled to fit a
//! small machine; its shape and the accelerator search are `dpuio_bench_core::unet3d`'s.
//! Here: how each path of this program loads a sample.
//!
//! Through the shim a reader opens the sample and has the agent put it into the reader's
//! registered region (the host touches no payload byte); through POSIX it reads the file
//! into memory with `std::fs::read`, as a plain-POSIX `Dataset` does; over DAOS
//! (`--backend daos`) the baseline is libdfs in `dpuio-bench-agent`: open, stat, one
//! `dfs_read` of the whole sample into memory, close, as pydaos loads a file.

use std::path::PathBuf;
use std::sync::Arc;

use dpuio_bench_core::child::Request;
use dpuio_bench_core::unet3d::{DATASET, Loader, READ_CHUNK, Unet3dArgs, sample_path, sample_sizes, search};
use dpuio_bench_core::{BENCH_DIR, Figures, LIBDFS};
use dpuio_shim::{Access, Client, RegionAccess};
use rand::{Rng, SeedableRng};

use crate::setup::Setup;

/// Write the dataset through the shim unless it is there with the right sizes.
async fn prepare(client: &Client, sizes: &[u64]) -> dpuio_shim::Result<()> {
    let paths: Vec<String> = (0..sizes.len()).map(sample_path).collect();
    let existing = client.lookup(&paths).await?;
    if existing.iter().zip(sizes).all(|(a, &n)| a.as_ref().is_ok_and(|a| a.size == n)) {
        return Ok(());
    }
    client.mkdir(&format!("{BENCH_DIR}/{DATASET}"), true).await?;
    let mut region = client.register_region(READ_CHUNK as usize, RegionAccess::ReadByAgent).await?;
    let mut bytes = vec![0u8; region.len()];
    rand::rngs::StdRng::seed_from_u64(4).fill(&mut bytes[..]);
    region.write_at(0, &bytes);
    for (path, &size) in paths.iter().zip(sizes) {
        let file = client.create(path, false).await?;
        let requests: Vec<_> = (0..size.div_ceil(READ_CHUNK))
            .map(|k| file.write_request(&region, 0, READ_CHUNK.min(size - k * READ_CHUNK), k * READ_CHUNK))
            .collect();
        for d in client.submit(requests).await? {
            d.result.map_err(|status| dpuio_shim::Error::Io { op: format!("write {path}"), status })?;
        }
        file.close().await?;
    }
    client.deregister_region(region).await
}

fn posix_loader(root: PathBuf) -> Loader {
    Arc::new(move |_reader, i| {
        let p = root.join(sample_path(i).trim_start_matches('/'));
        std::fs::read(&p).map(|v| v.len() as u64).map_err(|e| format!("{}: {e}", p.display()))
    })
}

/// Each reader thread (by index) owns one registered region as large as the largest sample.
async fn shim_loader(client: &Client, readers: usize, max_sample: u64) -> dpuio_shim::Result<Loader> {
    let mut regions = Vec::with_capacity(readers);
    for _ in 0..readers {
        regions.push(client.register_region(max_sample as usize, RegionAccess::WriteByAgent).await?);
    }
    let regions = Arc::new(regions);
    let client = client.clone();
    let runtime = tokio::runtime::Handle::current();
    Ok(Arc::new(move |reader, i| {
        let path = sample_path(i);
        let file = runtime.block_on(client.open(&path, Access::ReadOnly)).map_err(|e| e.to_string())?;
        let size = file.attr().size;
        let region = &regions[reader];
        let requests: Vec<_> = (0..size.div_ceil(READ_CHUNK))
            .map(|k| file.read_request(region, k * READ_CHUNK, READ_CHUNK.min(size - k * READ_CHUNK), k * READ_CHUNK))
            .collect();
        let mut loaded = 0;
        for d in client.submit_blocking(&requests).map_err(|e| e.to_string())? {
            loaded += d.result.map_err(|s| format!("read {path}: {}", s.describe()))?;
        }
        runtime.block_on(file.close()).map_err(|e| e.to_string())?;
        Ok(loaded)
    }))
}

/// [`search`] on `path`, its error as this program's.
fn search_on(path: &str, load: &Loader, args: &Unet3dArgs, setup: &Setup) -> dpuio_shim::Result<Figures> {
    tokio::task::block_in_place(|| search(path, load, args, setup))
        .map_err(|reason| dpuio_shim::Error::DataPlane { op: format!("unet3d {path}"), reason })
}

pub async fn unet3d(setup: &Setup, args: &Unet3dArgs) -> dpuio_shim::Result<Vec<Figures>> {
    if args.unet3d_samples == 0 || args.unet3d_batch == 0 || args.unet3d_read_threads == 0 || args.unet3d_steps < 2 {
        return Err(dpuio_shim::Error::DataPlane {
            op: "unet3d".into(),
            reason: "samples, batch and read threads must be positive and steps at least 2 (the first is not counted)"
                .into(),
        });
    }
    let sizes = sample_sizes(args);
    let max_sample = sizes.iter().copied().max().unwrap_or(4096);
    for client in setup.writers() {
        prepare(client, &sizes).await?;
    }
    let mut out = Vec::new();
    for fs in &setup.fs_paths {
        let load = posix_loader(fs.root.clone());
        out.push(search_on(fs.label, &load, args, setup)?);
    }
    out.extend(setup.ask_libdfs(format!("unet3d {LIBDFS}"), &Request::Unet3d(args.clone()))?);
    for (name, client) in &setup.clients {
        let readers = args.unet3d_read_threads * args.max_accelerators.max(1) as usize;
        let load = shim_loader(client, readers, max_sample).await?;
        out.push(search_on(name, &load, args, setup)?);
    }
    Ok(out)
}
