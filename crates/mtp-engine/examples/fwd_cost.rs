use candle_core::{DType, Device};
use mtp_engine::{Engine, LogitsAt};
use std::time::Instant;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).unwrap();
    let ctx: usize = std::env::args().nth(2).unwrap().parse()?;
    let engine = Engine::load(std::path::Path::new(&dir), &Device::Cpu, DType::F32)?;
    let model = engine.model();
    let mut cache = model.new_cache();
    let prompt: Vec<u32> = (0..ctx as u32).map(|i| 2 + i % 200).collect();
    model.forward(&[prompt], std::slice::from_mut(&mut cache), LogitsAt::Last)?;
    for l in 1..=5 {
        let reps: usize = std::env::args().nth(3).map_or(2000, |s| s.parse().unwrap());
        let t = Instant::now();
        for _ in 0..reps {
            let snap = cache.snapshot();
            cache.begin_verify();
            let toks: Vec<u32> = (0..l as u32).map(|i| 5 + i).collect();
            model.forward(&[toks], std::slice::from_mut(&mut cache), LogitsAt::All)?;
            cache.restore(&snap);
        }
        println!(
            "l={l}: {:.1} µs",
            t.elapsed().as_secs_f64() * 1e6 / reps as f64
        );
    }
    Ok(())
}
