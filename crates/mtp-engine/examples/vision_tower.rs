//! Times the vision tower on random weights of a given shape (no checkpoint needed):
//! `cargo run --release -p mtp-engine --example vision_tower -- [SIDE] [DEPTH] [HIDDEN] [HEADS]
//! [MLP]` encodes a SIDE x SIDE image (default 512: 1024 patches of 16 px, 256 tokens) with a
//! tower of DEPTH blocks (default the Qwen3-VL-2B shape: 24 blocks, hidden 1024, 16 heads, MLP
//! 4096) and prints the seconds per image and per patch.

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{Device, Tensor};
use mtp_engine::config::VisionConfig;
use mtp_engine::loader::Param;
use mtp_engine::nn::Store;
use mtp_engine::vision::VisionTower;
use mtp_engine::WeightDtype;

fn main() -> mtp_engine::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("sizes are numbers"))
        .collect();
    let arg = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (side, depth, hidden, heads, mlp) = (
        arg(0, 512),
        arg(1, 24),
        arg(2, 1024),
        arg(3, 16),
        arg(4, 4096),
    );
    let cfg = VisionConfig {
        depth,
        hidden_size: hidden,
        intermediate_size: mlp,
        out_hidden_size: 2048,
        num_heads: heads,
        patch_size: 16,
        temporal_patch_size: 2,
        spatial_merge_size: 2,
        in_channels: 3,
        num_position_embeddings: 2304,
        image_token_id: 0,
        video_token_id: 1,
        vision_start_token_id: 2,
        vision_end_token_id: 3,
    };
    let dev = Device::Cpu;
    let mut map: HashMap<String, Param> = HashMap::new();
    let mut put = |name: String, shape: &[usize]| {
        let t = Tensor::randn(0f32, 0.02, shape, &dev).expect("randn");
        map.insert(name, t.into());
    };
    let patch_in = 3 * 2 * 16 * 16;
    put("patch_embed.proj.weight".into(), &[hidden, 3, 2, 16, 16]);
    put("patch_embed.proj.bias".into(), &[hidden]);
    put("pos_embed.weight".into(), &[2304, hidden]);
    for i in 0..depth {
        let b = format!("blocks.{i}");
        for n in ["norm1", "norm2"] {
            put(format!("{b}.{n}.weight"), &[hidden]);
            put(format!("{b}.{n}.bias"), &[hidden]);
        }
        for (n, o, inp) in [
            ("attn.qkv", 3 * hidden, hidden),
            ("attn.proj", hidden, hidden),
            ("mlp.linear_fc1", mlp, hidden),
            ("mlp.linear_fc2", hidden, mlp),
        ] {
            put(format!("{b}.{n}.weight"), &[o, inp]);
            put(format!("{b}.{n}.bias"), &[o]);
        }
    }
    let merged = 4 * hidden;
    put("merger.norm.weight".into(), &[hidden]);
    put("merger.norm.bias".into(), &[hidden]);
    for (n, o, inp) in [("linear_fc1", merged, merged), ("linear_fc2", 2048, merged)] {
        put(format!("merger.{n}.weight"), &[o, inp]);
        put(format!("merger.{n}.bias"), &[o]);
    }
    let mut st = Store::new(map, "qwen3_5", WeightDtype::Stored, &dev);
    let tower = VisionTower::load(&cfg, &mut st, &dev)?;
    let g = side / 16;
    let n = g * g;
    let pixels: Vec<f32> = (0..n * patch_in)
        .map(|i| ((i % 251) as f32 / 125.0) - 1.0)
        .collect();
    let _ = tower.forward(&pixels, [1, g, g])?; // warm-up
    let t0 = Instant::now();
    let reps = 2;
    for _ in 0..reps {
        let _ = tower.forward(&pixels, [1, g, g])?;
    }
    let s = t0.elapsed().as_secs_f64() / reps as f64;
    println!(
        "{side}x{side} image, {n} patches -> {} tokens, tower depth {depth} hidden {hidden}: \
         {s:.2} s per image, {:.2} ms per patch",
        n / 4,
        s * 1e3 / n as f64
    );
    Ok(())
}
