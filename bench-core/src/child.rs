//! How a benchmark program hands figures to the one that started it: the preload
//! path's child (`dpuio-bench` under `LD_PRELOAD`) and the libdfs baseline
//! (`dpuio-bench-agent libdfs`) print them as marked lines on stdout, which the parent
//! reads ([`receive`]); anything else they print is theirs and passes through.
//!
//! The libdfs baseline also takes [`Request`]s, one JSON line each on its stdin, and
//! ends each answer with [`DONE`] or an [`ERROR`] line, so one child serves a whole run:
//! libdfs connects to the pool once, and the baseline's rounds interleave with the
//! shim's as in one process.

use crate::unet3d::Unet3dArgs;
use crate::{Figures, Workload};

/// Marks a child's figure lines on its stdout.
const LINE_PREFIX: &str = "dpuio-bench-figures ";
/// The libdfs baseline has mounted the container and takes requests.
pub const READY: &str = "dpuio-bench-ready";
/// The end of one answer: every figure of the request came before.
pub const DONE: &str = "dpuio-bench-done";
/// The request failed; what follows on the line says why.
pub const ERROR: &str = "dpuio-bench-error ";

/// In a child: hand `figures` to the parent, one line each on stdout.
pub fn send(figures: &[Figures]) {
    for f in figures {
        match serde_json::to_string(f) {
            Ok(json) => println!("{LINE_PREFIX}{json}"),
            Err(e) => eprintln!("dpuio-bench: cannot encode a figure: {e}"),
        }
    }
}

/// In the parent: the figure a child's stdout `line` carries, `None` for any other line.
pub fn receive(line: &str) -> Option<Result<Figures, String>> {
    let json = line.strip_prefix(LINE_PREFIX)?;
    Some(serde_json::from_str(json).map_err(|e| format!("a malformed figure line from the child: {e}")))
}

/// What the parent asks the libdfs baseline for: the baseline's part of one workload,
/// on the files the shim's part wrote.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Request {
    /// One round of a block workload on the benchmark file.
    Block { workload: Workload, block_bytes: u64, queue_depth: usize, file_bytes: u64, seconds: f64, seed: u64 },
    /// Create, stat, list and remove `files` files.
    Metadata { files: usize },
    /// The unet3d accelerator search on the dataset.
    Unet3d(Unet3dArgs),
    /// Write a checkpoint of `bytes`, durable, then read it back.
    Checkpoint { bytes: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_go_through_a_line_and_other_lines_do_not() {
        let f = Figures {
            workload: "seq-read".into(),
            path: "libdfs".into(),
            ops: 3,
            bytes: 3 << 20,
            ..Figures::default()
        };
        let line = format!("{LINE_PREFIX}{}", serde_json::to_string(&f).unwrap());
        let back = receive(&line).expect("a figure line").unwrap();
        assert_eq!(
            (back.workload.as_str(), back.path.as_str(), back.ops, back.bytes),
            ("seq-read", "libdfs", 3, 3 << 20)
        );
        assert!(receive("plot written to x.png").is_none());
        assert!(receive(&format!("{LINE_PREFIX}{{")).unwrap().is_err());
    }

    #[test]
    fn requests_are_one_line_of_json() {
        let r = Request::Block {
            workload: Workload::RandRead,
            block_bytes: 4096,
            queue_depth: 32,
            file_bytes: 1 << 30,
            seconds: 2.0,
            seed: 1,
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(!line.contains('\n'));
        let Request::Block { workload, queue_depth, .. } = serde_json::from_str(&line).unwrap() else {
            panic!("a block request")
        };
        assert_eq!((workload, queue_depth), (Workload::RandRead, 32));
    }
}
