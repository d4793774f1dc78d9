//! Pillow's bicubic resize, in its own fixed-point arithmetic.

// ------------------------------------------------------------------------------------------
// Pillow's bicubic resize
//
// Hand-written because the tokens depend on it: the `image` crate's resize filters in f32 and
// rounds differently, while Pillow (libImaging/Resample.c, 13.0.0) computes the filter taps in
// f64, turns them into 22-bit fixed point and accumulates in i32. Every step below follows that
// file: `precompute_coeffs`, `normalize_coeffs_8bpc`, `ImagingResampleHorizontal_8bpc` /
// `Vertical_8bpc` and the pass order of `ImagingResampleInner`.

/// Fixed-point bits of Pillow's 8-bit resampling: 32, minus 8 for the pixel, minus 2 of headroom
/// for the kernel's negative lobes and overshoot.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Pillow's `bicubic_filter` (Keys' cubic convolution, a = -0.5), in f64 as written there.
fn bicubic_filter(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = if x < 0.0 { -x } else { x };
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// The filter taps of one axis: for output position `i`, `bounds[i] = (first input, count)` and
/// `coeffs[i * ksize..][..count]` the fixed-point weights.
struct Taps {
    ksize: usize,
    bounds: Vec<(usize, usize)>,
    coeffs: Vec<i32>,
}

impl Taps {
    /// Pillow's `precompute_coeffs` + `normalize_coeffs_8bpc` for the whole axis (box 0..in).
    fn new(in_size: usize, out_size: usize) -> Self {
        // The box edges are C floats: `(double)(in1 - in0) / outSize`.
        let scale = f64::from(in_size as f32) / out_size as f64;
        let filterscale = if scale < 1.0 { 1.0 } else { scale };
        let support = 2.0 * filterscale; // BICUBIC's support is 2.0
        let ksize = support.ceil() as usize * 2 + 1;
        let inv_filterscale = 1.0 / filterscale;
        let mut bounds = Vec::with_capacity(out_size);
        let mut coeffs = vec![0i32; out_size * ksize];
        let mut k = vec![0f64; ksize];
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            // `(int)` truncates toward zero, as `as i64` does.
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64);
            let n = (xmax - xmin).max(0) as usize;
            let xmin = xmin as usize;
            let mut ww = 0.0;
            for (x, kx) in k.iter_mut().enumerate().take(n) {
                let w = bicubic_filter(((x + xmin) as f64 - center + 0.5) * inv_filterscale);
                *kx = w;
                ww += w;
            }
            let row = &mut coeffs[xx * ksize..][..n];
            for (c, &kx) in row.iter_mut().zip(&k[..n]) {
                let kx = if ww != 0.0 { kx / ww } else { kx };
                let fixed = kx * f64::from(1u32 << PRECISION_BITS);
                *c = if kx < 0.0 {
                    (-0.5 + fixed) as i32
                } else {
                    (0.5 + fixed) as i32
                };
            }
            bounds.push((xmin, n));
        }
        Self {
            ksize,
            bounds,
            coeffs,
        }
    }

    fn taps(&self, i: usize) -> (usize, &[i32]) {
        let (first, n) = self.bounds[i];
        (first, &self.coeffs[i * self.ksize..][..n])
    }
}

/// Pillow's `clip8`: the accumulator shifted down and clamped to 0..=255 (its lookup table
/// covers every value an `i32 >> 22` can take).
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Starting value of every accumulator: one half, for rounding.
const ROUND_HALF: i32 = 1 << (PRECISION_BITS - 1);

/// The horizontal pass over `rows` of `src` (width `in_w`, `c` channels), each channel of each
/// pixel summed over its taps in i32 as Pillow does (wrapping, which 8-bit input never reaches,
/// keeps it exact).
fn resample_horizontal(
    src: &[u8],
    in_w: usize,
    c: usize,
    rows: std::ops::Range<usize>,
    taps: &Taps,
    out_w: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; rows.len() * out_w * c];
    for (line_out, y) in out.chunks_exact_mut(out_w * c).zip(rows) {
        let line = &src[y * in_w * c..][..in_w * c];
        for (xx, px) in line_out.chunks_exact_mut(c).enumerate() {
            let (xmin, k) = taps.taps(xx);
            let window = &line[xmin * c..][..k.len() * c];
            for (ch, out_v) in px.iter_mut().enumerate() {
                let mut ss = ROUND_HALF;
                for (p, &kv) in window.chunks_exact(c).zip(k) {
                    ss = ss.wrapping_add(i32::from(p[ch]).wrapping_mul(kv));
                }
                *out_v = clip8(ss);
            }
        }
    }
    out
}

/// The vertical pass: `src` holds rows `row0..` of the image (width `w`, `c` channels).
fn resample_vertical(
    src: &[u8],
    w: usize,
    c: usize,
    row0: usize,
    taps: &Taps,
    out_h: usize,
) -> Vec<u8> {
    let row_len = w * c;
    let mut out = vec![0u8; out_h * row_len];
    let mut acc = vec![0i32; row_len];
    for (yy, line_out) in out.chunks_exact_mut(row_len).enumerate() {
        let (ymin, k) = taps.taps(yy);
        acc.fill(ROUND_HALF);
        for (i, &kv) in k.iter().enumerate() {
            let line = &src[(ymin + i - row0) * row_len..][..row_len];
            // Integer sums in any order (wrapping addition is associative): Pillow's result.
            for (a, &p) in acc.iter_mut().zip(line) {
                *a = a.wrapping_add(i32::from(p).wrapping_mul(kv));
            }
        }
        for (o, &a) in line_out.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
    out
}

/// Pillow-exact bicubic resize (`Image.resize((new_width, new_height), Image.BICUBIC)`) of an
/// 8-bit image of `channels` interleaved channels, each resampled on its own (as Pillow does for
/// L, RGB and CMYK; Pillow premultiplies RGBA / LA by alpha first, which this does not).
///
/// Two separable passes in Pillow's fixed point, each rounding to 8 bits: horizontal then
/// vertical, except that the vertical pass goes first when the height shrinks by more than
/// twice as many pixels as the width (Pillow's `horizontal_first` rule); a pass whose size does
/// not change is skipped, and an unchanged size is a copy. A zero output size gives an empty
/// buffer; a zero-size source gives zeros (Pillow has no input taps for it).
///
/// # Panics
///
/// If `src.len() != width * height * channels`, or an output size overflows `usize`.
pub fn resize_bicubic(
    src: &[u8],
    width: usize,
    height: usize,
    channels: usize,
    new_width: usize,
    new_height: usize,
) -> Vec<u8> {
    let in_len = width
        .checked_mul(height)
        .and_then(|n| n.checked_mul(channels))
        .expect("resize_bicubic: width * height * channels overflows");
    assert_eq!(
        src.len(),
        in_len,
        "resize_bicubic: {width}x{height}x{channels} needs {in_len} bytes, got {}",
        src.len()
    );
    let out_len = new_width
        .checked_mul(new_height)
        .and_then(|n| n.checked_mul(channels))
        .expect("resize_bicubic: new_width * new_height * channels overflows");
    if out_len == 0 {
        return Vec::new();
    }
    if (width, height) == (new_width, new_height) {
        return src.to_vec();
    }
    if in_len == 0 {
        return vec![0; out_len];
    }
    let c = channels;
    let need_horizontal = new_width != width;
    let need_vertical = new_height != height;
    // Pillow: `!((in_h - out_h) > 0 && (in_h - out_h) > (in_w - out_w) * 2)` in C ints.
    let (dh, dw) = (
        height as i64 - new_height as i64,
        width as i64 - new_width as i64,
    );
    let horizontal_first = !(dh > 0 && dh > dw * 2);
    match (need_horizontal, need_vertical) {
        (true, false) => resample_horizontal(
            src,
            width,
            c,
            0..height,
            &Taps::new(width, new_width),
            new_width,
        ),
        (false, true) => {
            resample_vertical(src, width, c, 0, &Taps::new(height, new_height), new_height)
        }
        _ if horizontal_first => {
            let vertical = Taps::new(height, new_height);
            // Only the source rows the vertical pass reads go through the horizontal pass.
            let first = vertical.bounds[0].0;
            let (last_min, last_n) = vertical.bounds[new_height - 1];
            let tmp = resample_horizontal(
                src,
                width,
                c,
                first..last_min + last_n,
                &Taps::new(width, new_width),
                new_width,
            );
            resample_vertical(&tmp, new_width, c, first, &vertical, new_height)
        }
        _ => {
            let tmp =
                resample_vertical(src, width, c, 0, &Taps::new(height, new_height), new_height);
            resample_horizontal(
                &tmp,
                width,
                c,
                0..new_height,
                &Taps::new(width, new_width),
                new_width,
            )
        }
    }
}
