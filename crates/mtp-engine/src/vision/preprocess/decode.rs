//! Decoding: a file's bytes to 8-bit RGB as Pillow gives them to mlx-vlm (orientation,
//! colour conversion, truncation checks).

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};

use super::*;

// ------------------------------------------------------------------------------------------
// Decoding

/// An 8-bit RGB image, rows top to bottom, pixels left to right, 3 bytes (R, G, B) each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `width * height * 3` bytes, HWC.
    pub data: Vec<u8>,
}

/// Bounds [`decode_image`] enforces before decoding anything (a decompression-bomb guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Largest accepted file, in bytes.
    pub max_bytes: usize,
    /// Largest accepted `width * height` as the file's header states it.
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    /// 64 MiB files, 8192 x 8192 pixels (Pillow itself refuses over 2 x 89,478,485 pixels).
    fn default() -> Self {
        Self {
            max_bytes: 64 << 20,
            max_pixels: 8192 * 8192,
        }
    }
}

/// Decodes a PNG, JPEG or WebP file (recognised by its signature, not by `name`) into 8-bit RGB
/// as mlx-vlm's `load_image` gets it from Pillow 13:
/// `ImageOps.exif_transpose(Image.open(f)).convert("RGB")`. `name` (a path, or e.g. "image 2")
/// names the image in errors.
///
/// * The EXIF orientation (tag 0x0112 of the eXIf chunk, APP1 segment or EXIF chunk; or, when
///   there is no such tag, `tiff:Orientation` in the XMP packet, as Pillow's `getexif` falls
///   back to) is applied: orientations 2-8 flip / rotate the image as Pillow does.
/// * RGBA / LA: alpha is dropped, not composited; L: grey replicated; palette: expanded (a tRNS
///   transparency is ignored); 1/2/4-bit grey: scaled to 0..255.
/// * 16-bit PNG: RGB, RGBA and grey+alpha keep the high byte of each sample (Pillow's `;16B`
///   unpackers); 16-bit grey (with or without tRNS) is opened by Pillow as `I;16`, whose
///   `convert("RGB")` clips every value above 255 to 255 (so mostly white), and that is what
///   this returns too.
/// * JPEG: decoded by zune-jpeg, not libjpeg-turbo: the IDCT and chroma upsampling differ, so
///   values may differ from Pillow's by a few levels (measured on the fixtures: at most 3, mean
///   0.35 for 4:2:0 chroma, 0.04 for 4:4:4; CMYK at most 1). PNG and WebP (lossless, and the
///   lossy file measured) are byte-identical to Pillow.
///
/// Pillow's decoding differs from this in rare cases only: an eXIf chunk after the image data,
/// or an EXIF block in a PNG text chunk ("Raw profile type exif"), is not read here; ICC
/// profiles and gamma are ignored by both.
///
/// Errors: over `limits` ([`ImageError::TooLarge`], from the header, before decoding), an
/// unknown format, a corrupt or truncated file, zero pixels.
pub fn decode_image(
    bytes: &[u8],
    name: &str,
    limits: &ImageLimits,
) -> Result<RgbImage, ImageError> {
    let (hdr, decoder) = open_image(bytes, name, limits)?;
    let img = DynamicImage::from_decoder(decoder).map_err(|e| decode_error(name, e))?;
    let rgb = to_rgb_like_pillow(img, hdr.png_grey16);
    debug_assert_eq!(rgb.len(), hdr.width * hdr.height * 3);
    let img = RgbImage {
        width: hdr.width,
        height: hdr.height,
        data: rgb,
    };
    let img = apply_orientation(img, hdr.orientation);
    tracing::debug!(
        image = name,
        format = ?hdr.format,
        width = img.width,
        height = img.height,
        orientation = hdr.orientation,
        "decoded image"
    );
    Ok(img)
}

/// The media type of an image file, from its signature (as [`decode_image`] recognises it):
/// `image/png`, `image/jpeg`, `image/webp`, else `application/octet-stream`.
pub fn media_type(bytes: &[u8]) -> &'static str {
    match image::guess_format(bytes) {
        Ok(ImageFormat::Png) => "image/png",
        Ok(ImageFormat::Jpeg) => "image/jpeg",
        Ok(ImageFormat::WebP) => "image/webp",
        _ => "application/octet-stream",
    }
}

/// The `(width, height)` [`decode_image`] gives (EXIF orientation applied), read from the
/// file's header without decoding its pixels; the same checks and errors before the pixels.
pub fn image_size(
    bytes: &[u8],
    name: &str,
    limits: &ImageLimits,
) -> Result<(usize, usize), ImageError> {
    let (h, _) = open_image(bytes, name, limits)?;
    Ok(if (5..=8).contains(&h.orientation) {
        (h.height, h.width)
    } else {
        (h.width, h.height)
    })
}

/// What a file's header says, read before any pixel is decoded.
struct Header {
    format: ImageFormat,
    width: usize,
    height: usize,
    orientation: u16,
    /// A 16-bit grey PNG (color type 0), which reaches us as grey+alpha when it has tRNS.
    png_grey16: bool,
}

/// `image::ImageError` as ours, naming the image.
fn decode_error(name: &str, e: image::ImageError) -> ImageError {
    match e {
        image::ImageError::Unsupported(u) => ImageError::Decode {
            name: name.to_string(),
            message: format!("unsupported: {u}"),
        },
        image::ImageError::Limits(l) => ImageError::TooLarge {
            name: name.to_string(),
            detail: format!("over the decoder's memory limit: {l}"),
        },
        e => ImageError::Decode {
            name: name.to_string(),
            message: e.to_string(),
        },
    }
}

/// The checks before decoding (size limits, format, completeness, the header's dimensions) and
/// the decoder, positioned at the pixels.
fn open_image<'a>(
    bytes: &'a [u8],
    name: &str,
    limits: &ImageLimits,
) -> Result<(Header, impl ImageDecoder + 'a), ImageError> {
    if bytes.len() > limits.max_bytes {
        return Err(ImageError::TooLarge {
            name: name.to_string(),
            detail: format!(
                "the file is {} bytes, over the limit of {} bytes",
                bytes.len(),
                limits.max_bytes
            ),
        });
    }
    let format = match image::guess_format(bytes) {
        Ok(f @ (ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP)) => f,
        Ok(other) => {
            return Err(ImageError::UnsupportedFormat {
                name: name.to_string(),
                detected: Some(format!("{other:?}")),
            })
        }
        Err(_) => {
            return Err(ImageError::UnsupportedFormat {
                name: name.to_string(),
                detected: None,
            })
        }
    };
    let complete = match format {
        ImageFormat::Jpeg => check_jpeg_complete(bytes),
        ImageFormat::WebP => check_webp_complete(bytes),
        _ => Ok(()),
    };
    complete.map_err(|message| ImageError::Decode {
        name: name.to_string(),
        message,
    })?;

    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut decoder_limits = image::Limits::default();
    // Room for the largest decoded buffer the pixel limit allows (16-bit RGBA) and the
    // decoders' own buffers; the pixel count itself is checked below, from the header.
    decoder_limits.max_alloc = Some(
        limits
            .max_pixels
            .saturating_mul(8)
            .saturating_add(256 << 20),
    );
    reader.limits(decoder_limits);
    let mut decoder = reader.into_decoder().map_err(|e| decode_error(name, e))?;

    let (w, h) = decoder.dimensions();
    let (width, height) = (w as usize, h as usize);
    if width == 0 || height == 0 {
        return Err(ImageError::Empty {
            name: name.to_string(),
            width,
            height,
        });
    }
    let pixels = u64::from(w) * u64::from(h);
    if pixels > limits.max_pixels {
        return Err(ImageError::TooLarge {
            name: name.to_string(),
            detail: format!(
                "the header says {w}x{h} = {pixels} pixels, over the limit of {}",
                limits.max_pixels
            ),
        });
    }

    // Orientation metadata is read before the pixels (a metadata error is not fatal: Pillow
    // would ignore an unparsable block too).
    let exif = decoder.exif_metadata().ok().flatten();
    let xmp = decoder.xmp_metadata().ok().flatten();
    let orientation = exif
        .as_deref()
        .and_then(exif_orientation)
        .or_else(|| xmp.as_deref().and_then(xmp_orientation))
        .unwrap_or(1);
    // 16-bit grey PNGs (color type 0), with tRNS, reach us as grey+alpha: tell them apart.
    let png_grey16 =
        format == ImageFormat::Png && bytes.get(24) == Some(&16) && bytes.get(25) == Some(&0);
    let header = Header {
        format,
        width,
        height,
        orientation,
        png_grey16,
    };
    Ok((header, decoder))
}

/// Pillow refuses a JPEG whose data ends before the decoder is done ("image file is truncated");
/// zune-jpeg (lenient mode, as the `image` crate runs it) would fill the rest with grey. Walks
/// the marker segments and the entropy-coded data to the EOI marker; an end of file before it is
/// an error.
fn check_jpeg_complete(bytes: &[u8]) -> Result<(), String> {
    let truncated = || Err("the JPEG file is truncated (no end-of-image marker)".to_string());
    let mut i = 2; // after SOI
    loop {
        // A marker: 0xFF, any fill 0xFF bytes, then the code.
        if i >= bytes.len() {
            return truncated();
        }
        if bytes[i] != 0xFF {
            // Garbage between segments: libjpeg skips to the next marker; so do we.
            i += 1;
            continue;
        }
        while i < bytes.len() && bytes[i] == 0xFF {
            i += 1;
        }
        let Some(&code) = bytes.get(i) else {
            return truncated();
        };
        i += 1;
        match code {
            0xD9 => return Ok(()),                 // EOI
            0x01 | 0xD0..=0xD8 | 0x00 => continue, // TEM, RSTn, SOI, stuffed: no length
            _ => {
                let Some(len) = bytes
                    .get(i..i + 2)
                    .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
                else {
                    return truncated();
                };
                i += len;
                if i > bytes.len() {
                    return truncated();
                }
                if code == 0xDA {
                    // SOS: entropy-coded data up to the next marker that is not a stuffed
                    // 0xFF00 or a restart marker.
                    loop {
                        match bytes.get(i..i + 2) {
                            None => return truncated(),
                            Some([0xFF, 0x00]) | Some([0xFF, 0xD0..=0xD7]) => i += 2,
                            Some([0xFF, _]) => break,
                            Some(_) => i += 1,
                        }
                    }
                }
            }
        }
    }
}

/// libwebp (so Pillow) refuses a WebP file shorter than its RIFF header says; image-webp would
/// decode the image if only trailing metadata chunks were cut off.
fn check_webp_complete(bytes: &[u8]) -> Result<(), String> {
    let riff = bytes
        .get(4..8)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    match riff {
        Some(size) if size.saturating_add(8) <= bytes.len() => check_webp_chunks(bytes, size + 8),
        Some(size) => Err(format!(
            "the WebP file is truncated ({} bytes, its header says {})",
            bytes.len(),
            size.saturating_add(8)
        )),
        None => Err("the WebP file is truncated".to_string()),
    }
}

/// Every chunk of the RIFF payload `bytes[12..end]` must lie inside it: image-webp allocates
/// what a chunk's header claims (the fuzzer found a 2.7 KB file making it reserve 2.5 GB
/// through a metadata chunk), so a claim past the end is refused before it decodes anything.
fn check_webp_chunks(bytes: &[u8], end: usize) -> Result<(), String> {
    let mut at = 12;
    while at + 8 <= end {
        let fourcc = String::from_utf8_lossy(&bytes[at..at + 4]).into_owned();
        let size = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]])
            as usize;
        let next = (at + 8)
            .checked_add(size)
            .and_then(|n| n.checked_add(size % 2));
        match next {
            // a final chunk may omit its padding byte
            Some(n) if n <= end || (size % 2 == 1 && n == end + 1) => at = n,
            _ => {
                return Err(format!(
                    "the WebP file's `{}` chunk claims {size} bytes, past the end of the file",
                    fourcc.escape_debug()
                ))
            }
        }
    }
    Ok(())
}

/// The orientation tag (0x0112) of an EXIF block (with or without the "Exif\0\0" prefix of a
/// JPEG APP1 segment): `Some(value)` when the tag is present, whatever its value, since Pillow
/// then ignores XMP.
pub(super) fn exif_orientation(exif: &[u8]) -> Option<u16> {
    let d = exif.strip_prefix(b"Exif\0\0").unwrap_or(exif);
    let le = match d.get(..4)? {
        b"II*\0" => true,
        b"MM\0*" => false,
        _ => return None,
    };
    let u16_at = |o: usize| {
        let b = d.get(o..o + 2)?;
        Some(if le {
            u16::from_le_bytes([b[0], b[1]])
        } else {
            u16::from_be_bytes([b[0], b[1]])
        })
    };
    let u32_at = |o: usize| {
        let b = d.get(o..o + 4)?;
        let b = [b[0], b[1], b[2], b[3]];
        Some(if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let ifd = usize::try_from(u32_at(4)?).ok()?;
    let entries = usize::from(u16_at(ifd)?);
    (0..entries).find_map(|n| {
        let entry = ifd + 2 + 12 * n;
        if u16_at(entry)? != 0x0112 {
            return None;
        }
        match u16_at(entry + 2)? {
            3 => u16_at(entry + 8),                                            // SHORT
            4 => u32_at(entry + 8).map(|v| v.min(u32::from(u16::MAX)) as u16), // LONG
            _ => d.get(entry + 8).map(|&b| u16::from(b)),                      // BYTE and the like
        }
    })
}

/// Pillow's XMP fallback: the first match of `tiff:Orientation(="|>)([0-9])`.
pub(super) fn xmp_orientation(xmp: &[u8]) -> Option<u16> {
    const KEY: &[u8] = b"tiff:Orientation";
    let mut from = 0;
    while let Some(pos) = xmp[from..].windows(KEY.len()).position(|w| w == KEY) {
        let rest = &xmp[from + pos + KEY.len()..];
        let digit = match rest {
            [b'=', b'"', d, ..] | [b'>', d, ..] if d.is_ascii_digit() => Some(*d),
            _ => None,
        };
        if let Some(d) = digit {
            return Some(u16::from(d - b'0'));
        }
        from += pos + 1;
    }
    None
}

/// Pillow's `convert("RGB")` of what it opened (see [`decode_image`] for the 16-bit rules).
fn to_rgb_like_pillow(img: DynamicImage, png_grey16: bool) -> Vec<u8> {
    fn grey(values: impl Iterator<Item = u8>, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len * 3);
        for v in values {
            out.extend_from_slice(&[v, v, v]);
        }
        out
    }
    // Pillow's I;16 -> RGB: `in[1] == 0 ? in[0] : 255`.
    let clip16 = |v: u16| u8::try_from(v).unwrap_or(255);
    let high = |v: u16| (v >> 8) as u8;
    let n = (img.width() as usize) * (img.height() as usize);
    match img {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageRgba8(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        DynamicImage::ImageLuma8(b) => grey(b.into_raw().into_iter(), n),
        DynamicImage::ImageLumaA8(b) => grey(b.into_raw().chunks_exact(2).map(|p| p[0]), n),
        DynamicImage::ImageLuma16(b) => grey(b.into_raw().into_iter().map(clip16), n),
        DynamicImage::ImageLumaA16(b) => {
            let to8 = if png_grey16 { clip16 } else { high };
            grey(b.into_raw().chunks_exact(2).map(|p| to8(p[0])), n)
        }
        DynamicImage::ImageRgb16(b) => b.into_raw().into_iter().map(high).collect(),
        DynamicImage::ImageRgba16(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [high(p[0]), high(p[1]), high(p[2])])
            .collect(),
        // PNG, JPEG and WebP decode to none of the other layouts.
        other => other.to_rgb8().into_raw(),
    }
}

/// Pillow's `exif_transpose`: 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE,
/// 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90 (Pillow's rotations are counter-clockwise); any other
/// value leaves the image as it is.
fn apply_orientation(img: RgbImage, orientation: u16) -> RgbImage {
    let (w, h) = (img.width, img.height);
    // For each output pixel (x, y), the source pixel.
    let map: fn(usize, usize, usize, usize) -> (usize, usize) = match orientation {
        2 => |x, y, w, _| (w - 1 - x, y),
        3 => |x, y, w, h| (w - 1 - x, h - 1 - y),
        4 => |x, y, _, h| (x, h - 1 - y),
        5 => |x, y, _, _| (y, x),
        6 => |x, y, _, h| (y, h - 1 - x),
        7 => |x, y, w, h| (w - 1 - y, h - 1 - x),
        8 => |x, y, w, _| (w - 1 - y, x),
        _ => return img,
    };
    let (ow, oh) = if orientation >= 5 { (h, w) } else { (w, h) };
    let mut data = Vec::with_capacity(img.data.len());
    for y in 0..oh {
        for x in 0..ow {
            let (sx, sy) = map(x, y, w, h);
            let i = (sy * w + sx) * 3;
            data.extend_from_slice(&img.data[i..i + 3]);
        }
    }
    RgbImage {
        width: ow,
        height: oh,
        data,
    }
}
