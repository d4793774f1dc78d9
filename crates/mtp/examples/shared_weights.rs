//! Memory figure for the native provider: two providers on one checkpoint share one copy of the
//! weights, and `unload` frees it once the last user is gone.
//!
//! ```text
//! cargo xtask fixtures --out /tmp/bench-model        # a 0.6 GiB checkpoint (benchmark shape)
//! cargo run --release -p mtp --example shared_weights -- /tmp/bench-model
//! ```
//! Without an argument it uses the bundled demo model (too small for the figure to show much).
//! Resident memory is read from `/proc/self/status` (Linux).

use std::path::Path;

use mtp::{create_llm, ProviderOptions, Speculation};

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn row(step: &str, model: &Path, base: f64) {
    let rss = rss_mib();
    println!(
        "| {step} | {:.0} | {:+.0} | {} |",
        rss,
        rss - base,
        mtp::native::loaded_copies(model)
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "models/tiny-code".to_string());
    let path = Path::new(&model);
    let opts = || ProviderOptions::default().speculation(Speculation::native_mtp());
    println!("| step | RSS MiB | vs start | loaded copies |");
    println!("| --- | --- | --- | --- |");
    let base = rss_mib();
    row("start", path, base);
    let a = create_llm("native", &model, opts())?;
    row("provider A created", path, base);
    let b = create_llm("native", &model, opts())?;
    row("provider B created (same checkpoint)", path, base);
    a.unload().await?;
    row("A unloaded (B still holds the weights)", path, base);
    b.unload().await?;
    row("B unloaded", path, base);
    Ok(())
}
