//! The agent's config file parser (`Config::parse`, dpu-agent/src/config.rs): any
//! text gives a config or issues, never a panic; the same text gives the same result,
//! and every issue names a key and a reason.
#![no_main]

use dpuio_fuzz::config::{Config, ParseError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|b: &[u8]| {
    let Ok(text) = std::str::from_utf8(b) else { return };
    match Config::parse(text) {
        Ok(config) => {
            assert_eq!(Config::parse(text).ok(), Some(config.clone()), "parsing is deterministic");
            let _ = (config.default_tenant(), config.admin_socket(), config.data_plane.lanes());
        }
        Err(ParseError::Invalid(issues)) => {
            assert!(!issues.is_empty());
            for issue in &issues {
                assert!(!issue.to_string().is_empty());
            }
        }
        Err(ParseError::Syntax(message)) => assert!(!message.is_empty()),
    }
});
