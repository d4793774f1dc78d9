//! Images inside a prompt: the expanded `<|image_pad|>` runs, the features that replace their
//! embeddings, and the multimodal rotary position ids of every token (mlx-vlm 0.7.10's
//! `get_rope_index` for Qwen3.5).
//!
//! A text token's three position ids are equal; an image's tokens sit on its merged patch grid
//! (`[start + t, start + row, start + col]`, `start` the position its first token would have as
//! text), and the text after an image goes on from the image's largest id plus one. So a token's
//! position is its index plus an offset that changes only at images: the state kept per
//! sequence is the list of image spans, shared (`Arc`) by the sequence's cache and its copies.

use std::sync::Arc;

use crate::error::{Error, Result};

/// One image's place in a prompt and its features.
#[derive(Clone)]
pub struct ImageSpan {
    /// Index of the image's first `<|image_pad|>` token.
    pub start: usize,
    /// Merged grid `[t, h, w]`: the image's tokens are `t · h · w` in a row.
    pub grid: [usize; 3],
    /// The rows that replace the image's token embeddings, `[t · h · w, hidden]`.
    pub features: Arc<[f32]>,
    /// SHA-256 of the image file's bytes.
    pub digest: [u8; 32],
}

/// The feature values are left out (thousands of them per image).
impl std::fmt::Debug for ImageSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageSpan")
            .field("start", &self.start)
            .field("grid", &self.grid)
            .field(
                "features",
                &format_args!("[{} values]", self.features.len()),
            )
            .finish_non_exhaustive()
    }
}

/// The feature values are left out (thousands of them per image).
impl std::fmt::Debug for EncodedImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodedImage")
            .field("grid", &self.grid)
            .field(
                "features",
                &format_args!("[{} values]", self.features.len()),
            )
            .finish_non_exhaustive()
    }
}

impl ImageSpan {
    fn len(&self) -> usize {
        self.grid.iter().product()
    }

    fn end(&self) -> usize {
        self.start + self.len()
    }
}

/// An image encoded by the vision tower: its merged grid and features (see
/// [`crate::Engine::encode_image`]).
#[derive(Clone)]
pub struct EncodedImage {
    /// Merged grid `[t, h, w]` (the patch grid divided by the merge size in height and width).
    pub grid: [usize; 3],
    /// `[t · h · w, hidden]` features.
    pub features: Arc<[f32]>,
    /// SHA-256 of the image file's bytes (prefix caches key on it).
    pub digest: [u8; 32],
}

impl EncodedImage {
    /// Language-model tokens the image takes.
    pub fn num_tokens(&self) -> usize {
        self.grid.iter().product()
    }
}

/// The images of one sequence's prompt.
#[derive(Debug, Clone)]
pub struct MultimodalPrompt {
    spans: Vec<ImageSpan>,
    hidden: usize,
    image_token_id: u32,
}

impl MultimodalPrompt {
    /// Places `images` (in order) on the `<|image_pad|>` runs of `tokens` (already expanded: one
    /// pad per image token, see [`expand_image_tokens`]), as `get_rope_index` finds them: image
    /// `k` starts at the first pad at or after the end of image `k - 1` and must be a run of
    /// exactly its token count. Stray pads, a short run or a missing image are errors.
    pub fn new(
        tokens: &[u32],
        image_token_id: u32,
        images: &[EncodedImage],
        hidden: usize,
    ) -> Result<Self> {
        let mut spans = Vec::with_capacity(images.len());
        let mut st = 0;
        for (k, img) in images.iter().enumerate() {
            let n = img.num_tokens();
            if img.features.len() != n * hidden {
                return Err(Error::InvalidRequest(format!(
                    "image {k}: {} feature values for {n} tokens of width {hidden}",
                    img.features.len()
                )));
            }
            let Some(start) = tokens[st..]
                .iter()
                .position(|&t| t == image_token_id)
                .map(|i| st + i)
            else {
                return Err(Error::InvalidRequest(format!(
                    "the prompt has no image placeholder for image {k} ({} images given)",
                    images.len()
                )));
            };
            let run = tokens[start..]
                .iter()
                .take_while(|&&t| t == image_token_id)
                .count();
            if run != n {
                return Err(Error::InvalidRequest(format!(
                    "image {k} takes {n} tokens but its placeholder run has {run}"
                )));
            }
            spans.push(ImageSpan {
                start,
                grid: img.grid,
                features: img.features.clone(),
                digest: img.digest,
            });
            st = start + n;
        }
        if let Some(i) = tokens[st..].iter().position(|&t| t == image_token_id) {
            return Err(Error::InvalidRequest(format!(
                "the prompt has an image placeholder at token {} but only {} image(s)",
                st + i,
                images.len()
            )));
        }
        Ok(MultimodalPrompt {
            spans,
            hidden,
            image_token_id,
        })
    }

    /// Checks that `tokens` is a prompt these images were placed on: every span a run of
    /// pads, no pad elsewhere, features as wide as the model's hidden size.
    pub fn check_fits(&self, tokens: &[u32], hidden: usize) -> Result<()> {
        if hidden != self.hidden {
            return Err(Error::InvalidRequest(format!(
                "image features of width {} for a model of hidden size {hidden}",
                self.hidden
            )));
        }
        let mut pads = 0;
        for s in &self.spans {
            let ok = tokens
                .get(s.start..s.end())
                .is_some_and(|r| r.iter().all(|&t| t == self.image_token_id));
            if !ok {
                return Err(Error::InvalidRequest(format!(
                    "the prompt has no image placeholder run at tokens {}..{}",
                    s.start,
                    s.end()
                )));
            }
            pads += s.len();
        }
        let all = tokens.iter().filter(|&&t| t == self.image_token_id).count();
        if all != pads {
            return Err(Error::InvalidRequest(format!(
                "the prompt has {all} image placeholder tokens, its images take {pads}"
            )));
        }
        Ok(())
    }

    /// The image spans, in order.
    pub fn spans(&self) -> &[ImageSpan] {
        &self.spans
    }

    /// The token the images are placed on (`<|image_pad|>`).
    pub fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    /// Spans already checked by the caller (a saved state's, see `persist`).
    pub(crate) fn from_parts(spans: Vec<ImageSpan>, hidden: usize, image_token_id: u32) -> Self {
        MultimodalPrompt {
            spans,
            hidden,
            image_token_id,
        }
    }

    /// True when the tokens before `upto` hold the same images at the same places in both
    /// prompts (`None`: a prompt without images): a state taken after `upto` tokens of one
    /// continues the other.
    pub fn same_prefix(a: Option<&Self>, b: Option<&Self>, upto: usize) -> bool {
        let key = |m: Option<&Self>| -> Vec<(usize, [usize; 3], [u8; 32])> {
            m.map_or_else(Vec::new, |m| {
                m.spans
                    .iter()
                    .filter(|s| s.start < upto)
                    .map(|s| (s.start, s.grid, s.digest))
                    .collect()
            })
        };
        key(a) == key(b)
    }

    /// The offset of the text position at or after token `index` from the index (the sum over
    /// the images before it of their largest id minus their token count).
    fn text_offset(&self, index: usize) -> i64 {
        self.spans
            .iter()
            .take_while(|s| s.end() <= index)
            .map(|s| *s.grid.iter().max().unwrap_or(&0) as i64 - s.len() as i64)
            .sum()
    }

    /// The position ids `[t, h, w]` of tokens `start .. start + len`; `None` when they are
    /// text at one offset of zero (plain positions).
    pub fn position_ids(&self, start: usize, len: usize) -> Option<Vec<[usize; 3]>> {
        let end = start + len;
        let touches = self.spans.iter().any(|s| s.start < end);
        if !touches {
            return None;
        }
        let mut out = Vec::with_capacity(len);
        for i in start..end {
            match self.spans.iter().find(|s| s.start <= i && i < s.end()) {
                Some(s) => {
                    let base = (s.start as i64 + self.text_offset(s.start)) as usize;
                    let j = i - s.start;
                    let [_, h, w] = s.grid;
                    let (t, r, c) = (j / (h * w), (j / w) % h, j % w);
                    out.push([base + t, base + r, base + c]);
                }
                None => {
                    let p = (i as i64 + self.text_offset(i)) as usize;
                    out.push([p; 3]);
                }
            }
        }
        Some(out)
    }

    /// Writes the image features over the embeddings `x` (`len` rows of `hidden`) of tokens
    /// `start .. start + len`.
    pub fn write_features(&self, start: usize, len: usize, x: &mut [f32]) {
        let d = self.hidden;
        for s in &self.spans {
            let (a, b) = (s.start.max(start), s.end().min(start + len));
            for i in a..b {
                let src = &s.features[(i - s.start) * d..(i - s.start + 1) * d];
                x[(i - start) * d..(i - start + 1) * d].copy_from_slice(src);
            }
        }
    }

    /// mlx-vlm's `rope_deltas`: position minus index of the text after the last image.
    pub fn rope_delta(&self) -> i64 {
        self.text_offset(usize::MAX)
    }
}

/// SHA-256 of an image file's bytes: what prefix caches key an image on.
pub fn image_digest(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}

/// Replaces the `k`-th `<|image_pad|>` of `tokens` by `counts[k]` pads (what the processor does
/// to the rendered prompt before tokenizing). The prompt must hold exactly one pad per image.
pub fn expand_image_tokens(
    tokens: &[u32],
    image_token_id: u32,
    counts: &[usize],
) -> Result<Vec<u32>> {
    let pads = tokens.iter().filter(|&&t| t == image_token_id).count();
    if pads != counts.len() {
        return Err(Error::InvalidRequest(format!(
            "the prompt has {pads} image placeholder(s) for {} image(s)",
            counts.len()
        )));
    }
    let mut out = Vec::with_capacity(tokens.len() + counts.iter().sum::<usize>());
    let mut k = 0;
    for &t in tokens {
        if t == image_token_id {
            out.extend(std::iter::repeat_n(t, counts[k]));
            k += 1;
        } else {
            out.push(t);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(grid: [usize; 3], hidden: usize, fill: f32) -> EncodedImage {
        let n: usize = grid.iter().product();
        EncodedImage {
            grid,
            features: vec![fill; n * hidden].into(),
            digest: [fill as u8; 32],
        }
    }

    /// The example of transformers' `get_rope_index` docstring-style reasoning, worked by
    /// hand: 2 text tokens, an image of 1 x 2 x 3 merged tokens, 3 text tokens.
    #[test]
    fn positions_follow_get_rope_index() {
        let p = 9;
        let tokens = [1, 2, p, p, p, p, p, p, 3, 4, 5];
        let m = MultimodalPrompt::new(&tokens, p, &[image([1, 2, 3], 1, 0.5)], 1).unwrap();
        let ids = m.position_ids(0, tokens.len()).unwrap();
        let t: Vec<usize> = ids.iter().map(|x| x[0]).collect();
        let h: Vec<usize> = ids.iter().map(|x| x[1]).collect();
        let w: Vec<usize> = ids.iter().map(|x| x[2]).collect();
        assert_eq!(t, [0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7]);
        assert_eq!(h, [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7]);
        assert_eq!(w, [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7]);
        // after the prompt: index + delta, delta = 5 - 8 = -3
        assert_eq!(m.rope_delta(), -3);
        assert_eq!(m.position_ids(11, 1), Some(vec![[8; 3]]));
        // a chunk boundary inside the image gives the same ids
        let mut parts = m.position_ids(0, 4).unwrap();
        parts.extend(m.position_ids(4, 7).unwrap());
        assert_eq!(parts, ids);
    }

    #[test]
    fn features_replace_the_pad_rows() {
        let p = 7;
        let tokens = [1, p, p, 2, p, 3];
        let imgs = [image([1, 1, 2], 2, 1.0), image([1, 1, 1], 2, 2.0)];
        let m = MultimodalPrompt::new(&tokens, p, &imgs, 2).unwrap();
        let mut x = vec![0f32; 4 * 2];
        m.write_features(1, 4, &mut x);
        assert_eq!(x, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 2.0, 2.0]);
    }

    #[test]
    fn placeholders_must_match_the_images() {
        let p = 7;
        assert_eq!(
            expand_image_tokens(&[1, p, 2], p, &[3]).unwrap(),
            [1, p, p, p, 2]
        );
        assert!(expand_image_tokens(&[1, p, 2, p], p, &[3]).is_err());
        assert!(expand_image_tokens(&[1, 2], p, &[3]).is_err());
        let img = image([1, 1, 2], 1, 0.0);
        // short run, stray pad, missing placeholder
        assert!(MultimodalPrompt::new(&[1, p, 2], p, std::slice::from_ref(&img), 1).is_err());
        assert!(MultimodalPrompt::new(&[p, p, 2, p], p, std::slice::from_ref(&img), 1).is_err());
        assert!(MultimodalPrompt::new(&[1, 2], p, &[img], 1).is_err());
    }
}
