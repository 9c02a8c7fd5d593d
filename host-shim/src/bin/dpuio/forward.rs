//! `dpuio bench ...` runs the `dpuio-bench` program, the way `git foo` runs `git-foo`:
//! the benchmarks and what they pull in (plotting, progress bars, libdfs, the agent's
//! ciphers) stay out of the host library and this command. `dpuio-bench` is looked for
//! beside this executable first (an install or a cargo target directory holds both),
//! then on `PATH`; it replaces this process, so its exit status is the command's.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dpuio_shim::cli::ConnectArgs;

/// The program `dpuio bench` runs.
const BENCH_PROGRAM: &str = "dpuio-bench";

/// The exit status when the program is missing, as a shell's for a command not found.
const NOT_FOUND: u8 = 127;

/// Run `dpuio-bench ARGS` with the connection options given to `dpuio` (in their
/// `DPUIO_*` variables); returns only when it cannot be started.
pub fn bench(connect: &ConnectArgs, args: &[OsString]) -> ExitCode {
    let beside = std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_owned));
    let program = match find_program(BENCH_PROGRAM, beside.as_deref(), std::env::var_os("PATH").as_deref()) {
        Ok(program) => program,
        Err(looked) => {
            eprintln!("dpuio: bench runs {BENCH_PROGRAM}, which is not installed: looked for {}", looked_in(&looked));
            eprintln!(
                "dpuio: install it beside dpuio (the dpuio-host package ships both; `cargo build --bins` builds both)"
            );
            return ExitCode::from(NOT_FOUND);
        }
    };
    // arg0 `dpuio bench`: its usage lines and messages name the command the user typed.
    let error = std::process::Command::new(&program).arg0("dpuio bench").args(args).envs(connect.to_env()).exec();
    eprintln!("dpuio: cannot run {}: {error}", program.display());
    ExitCode::from(NOT_FOUND)
}

/// `name` in `beside` if it is an executable file there, else in the first directory
/// of `path` (a `PATH` value) that has it; or every place looked at.
fn find_program(name: &str, beside: Option<&Path>, path: Option<&OsStr>) -> Result<PathBuf, Vec<PathBuf>> {
    let dirs = beside.map(Path::to_owned).into_iter().chain(path.into_iter().flat_map(std::env::split_paths));
    let mut looked = Vec::new();
    for dir in dirs {
        // An empty PATH entry means the current directory; a program runs from there only
        // when named with a slash, so it is not one to find.
        if dir.as_os_str().is_empty() {
            continue;
        }
        let candidate = dir.join(name);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
        looked.push(candidate);
    }
    Err(looked)
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn looked_in(looked: &[PathBuf]) -> String {
    if looked.is_empty() {
        return "nowhere (dpuio's own directory is unknown and PATH is empty)".to_owned();
    }
    let places: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
    format!("{} (beside dpuio, then on PATH)", places.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(dir: &Path, mode: u32) -> PathBuf {
        let p = dir.join(BENCH_PROGRAM);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn beside_dpuio_comes_before_path() {
        let (own, on_path) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mine = program(own.path(), 0o755);
        program(on_path.path(), 0o755);
        let path = std::env::join_paths([on_path.path()]).unwrap();
        assert_eq!(find_program(BENCH_PROGRAM, Some(own.path()), Some(&path)), Ok(mine));
    }

    #[test]
    fn path_is_searched_in_order_past_non_executables() {
        let (own, first, second) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        program(first.path(), 0o644); // not executable: passed over
        let found = program(second.path(), 0o755);
        let path = std::env::join_paths(["".as_ref(), first.path(), second.path()]).unwrap();
        assert_eq!(find_program(BENCH_PROGRAM, Some(own.path()), Some(&path)), Ok(found));
    }

    #[test]
    fn a_missing_program_names_every_place_looked() {
        let (own, on_path) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let path = std::env::join_paths([on_path.path()]).unwrap();
        let looked = find_program(BENCH_PROGRAM, Some(own.path()), Some(&path)).unwrap_err();
        assert_eq!(looked, vec![own.path().join(BENCH_PROGRAM), on_path.path().join(BENCH_PROGRAM)]);
        let text = looked_in(&looked);
        assert!(text.starts_with(&own.path().join(BENCH_PROGRAM).display().to_string()), "{text}");
        assert!(text.contains(&on_path.path().join(BENCH_PROGRAM).display().to_string()), "{text}");
    }
}
