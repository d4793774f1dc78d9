//! Rotary position embedding: text positions and Qwen's interleaved multimodal layout.

/// Rotary embedding tables: `inv_freq[i] = theta^(-2i / rot_dim)`, and which of a row's three
/// position ids (temporal, height, width: Qwen's multimodal rope) each frequency turns with.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// Position id (0, 1 or 2) of frequency `i`.
    axis: Vec<u8>,
    rot_dim: usize,
}

impl Rope {
    /// Rotary embedding over the first `rot_dim` features of each head; every frequency turns
    /// with the temporal id (which, for text, is the position).
    pub fn new(rot_dim: usize, theta: f64) -> Self {
        let inv_freq: Vec<f32> = (0..rot_dim / 2)
            .map(|i| (1.0 / theta.powf((2 * i) as f64 / rot_dim as f64)) as f32)
            .collect();
        let axis = vec![0; inv_freq.len()];
        Rope {
            inv_freq,
            axis,
            rot_dim,
        }
    }

    /// [`Rope::new`] with Qwen3.5's interleaved multimodal layout (mlx-vlm's
    /// `_interleaved_position_selector`): frequency `i` turns with the height id when
    /// `i % 3 == 1 && i < 3 * section[1]`, with the width id when `i % 3 == 2 && i < 3 *
    /// section[2]`, else with the temporal id.
    pub fn interleaved(rot_dim: usize, theta: f64, section: [usize; 3]) -> Self {
        let mut r = Self::new(rot_dim, theta);
        for (i, a) in r.axis.iter_mut().enumerate() {
            for (dim, offset) in [(1u8, 1usize), (2, 2)] {
                if i % 3 == offset && i < section[dim as usize] * 3 {
                    *a = dim;
                }
            }
        }
        r
    }

    /// A rope over explicit frequencies (the vision tower's 2D rope: `inv_freq` and the axis
    /// each frequency turns with), rotating `2 * inv_freq.len()` features.
    pub fn from_parts(inv_freq: Vec<f32>, axis: Vec<u8>) -> Self {
        assert_eq!(inv_freq.len(), axis.len(), "rope: one axis per frequency");
        assert!(axis.iter().all(|&a| a < 3), "rope: axes are 0, 1 or 2");
        let rot_dim = 2 * inv_freq.len();
        Rope {
            inv_freq,
            axis,
            rot_dim,
        }
    }

    /// Rotates one head vector in place at position `pos` on every axis (rotate-half pairing,
    /// as the text positions of Qwen's interleaved multimodal rope reduce to).
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.rot_dim / 2;
        for (i, f) in self.inv_freq.iter().enumerate() {
            let angle = pos as f32 * f;
            let (s, c) = angle.sin_cos();
            let a = x[i];
            let b = x[i + half];
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
    }

    /// Rotates one head vector at the three position ids `pos` (temporal, height, width): each
    /// frequency turns with its own axis. Equal ids give the bits of [`Rope::apply`].
    pub fn apply_at(&self, x: &mut [f32], pos: [usize; 3]) {
        let half = self.rot_dim / 2;
        for (i, (f, &a)) in self.inv_freq.iter().zip(&self.axis).enumerate() {
            let angle = pos[a as usize] as f32 * f;
            let (s, c) = angle.sin_cos();
            let a = x[i];
            let b = x[i + half];
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
    }
}
