#!/usr/bin/env node
// Regenerates the Llama 3 tokenizer's known answers (models/data/testdata/llama3/), outside the
// build (CI has no network):
//
//   mkdir -p /tmp/l3tok && cd /tmp/l3tok && npm install llama3-tokenizer-js@1.2.0
//   node models/data/testdata/llama3/make_llama3_fixture.mjs \
//       /tmp/l3tok/node_modules/llama3-tokenizer-js [/tmp/l3tok/tokenizer.model]
//
// The npm package (MIT; belladoreai/llama3-tokenizer-js) ships Llama 3's vocabulary as Hugging
// Face's byte-level strings in id order, and its own JavaScript encoder (merges + a priority
// queue: an implementation independent of ours). For each NAME.txt here this writes
//   NAME.ids     the package's ids (no bos/eos; text like <|eot_id|> is a special token),
//   NAME.pieces  the byte length of each pre-token of Llama 3's pattern (JavaScript's regex),
// and for all texts together
//   llama3_subset.tiktoken  the tokens that encoding passes through, in tiktoken's format
//     ("base64 rank" lines, rank = id): the 256 single bytes, every intermediate merge result and
//     every final token, with their ORIGINAL ranks. BPE by minimal rank on this subset makes the
//     same choices as on the full vocabulary: each merge it picks is in the subset, and every
//     candidate left out had a higher rank than the merge picked instead.
// A rank-based BPE written here (tiktoken's algorithm) must reproduce the package's ids first.
// With a second argument it also writes the full vocabulary as a tokenizer.model (for
// SHARDMAP_LLAMA3_TOKENIZER_MODEL=... in tiktoken_tokenizer_test; not committed, 2 MB).
import fs from 'fs';
import path from 'path';
import url from 'url';

const pkg = process.argv[2];
if (!pkg) {
  console.error('usage: make_llama3_fixture.mjs DIR_OF_llama3-tokenizer-js [FULL_tokenizer.model]');
  process.exit(2);
}
const here = path.dirname(url.fileURLToPath(import.meta.url));
const mod = await import(url.pathToFileURL(path.join(pkg, 'bundle/llama3-tokenizer-with-baked-data.js')));
const tok = mod.default;
const NUM_BASE = 128000;

// Hugging Face's (GPT-2's) byte-to-character map, inverted: character -> byte.
const charByte = new Map();
{
  const printable = (b) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  let n = 0;
  for (let b = 0; b < 256; b++) charByte.set(String.fromCharCode(printable(b) ? b : 256 + n++), b);
}
// Token bytes as a latin1 string (one char per byte), the key of `rank`.
const bytesOf = [];
const rank = new Map();
for (let id = 0; id < NUM_BASE; id++) {
  const s = tok.vocabById[id];
  const bytes = Buffer.from([...s].map((c) => {
    if (!charByte.has(c)) throw new Error(`token ${id}: character ${c} is not a byte character`);
    return charByte.get(c);
  }));
  const key = bytes.toString('latin1');
  if (rank.has(key)) throw new Error(`token ${id} repeats token ${rank.get(key)}`);
  bytesOf.push(key);
  rank.set(key, id);
}
if (tok.vocabById[NUM_BASE] !== '<|begin_of_text|>') throw new Error('ids moved: 128000 is not bos');

// Llama 3's pattern, with (?i:...) spelt out for JavaScript (as the package does).
const pat = /(?:'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;
const special = /<\|(?:begin_of_text|end_of_text|start_header_id|end_header_id|eot_id)\|>/g;

// tiktoken's byte_pair_merge: the leftmost adjacent pair whose concatenation has the lowest rank
// merges, until no concatenation is a token. Records every token it makes in `seen`.
function bpe(piece, seen) {
  if (rank.has(piece)) {
    seen.add(piece);
    return [rank.get(piece)];
  }
  let parts = [...piece];
  for (const p of parts) seen.add(p);
  for (;;) {
    let best = -1, bestRank = Infinity;
    for (let i = 0; i + 1 < parts.length; i++) {
      const r = rank.get(parts[i] + parts[i + 1]);
      if (r !== undefined && r < bestRank) best = i, bestRank = r;
    }
    if (best < 0) break;
    parts.splice(best, 2, parts[best] + parts[best + 1]);
    seen.add(parts[best]);
  }
  return parts.map((p) => rank.get(p));
}

const seen = new Set();
for (let b = 0; b < 256; b++) seen.add(String.fromCharCode(b));
const names = fs.readdirSync(here).filter((f) => f.endsWith('.txt')).sort();
for (const name of names) {
  const text = fs.readFileSync(path.join(here, name), 'utf-8');
  const ids = tok.encode(text, {bos: false, eos: false});
  const base = name.replace(/\.txt$/, '');
  fs.writeFileSync(path.join(here, base + '.ids'), ids.join('\n') + '\n');
  const mine = [], lengths = [];
  let last = 0;
  const plain = (s) => {
    for (const m of s.matchAll(pat)) {
      const piece = Buffer.from(m[0], 'utf-8').toString('latin1');
      lengths.push(piece.length);
      mine.push(...bpe(piece, seen));
    }
  };
  for (const m of text.matchAll(special)) {
    plain(text.slice(last, m.index));
    mine.push(tok.vocabByString.get(m[0]));
    last = m.index + m[0].length;
  }
  plain(text.slice(last));
  if (mine.join(',') !== ids.join(',')) throw new Error(name + ': this BPE disagrees with the package');
  if (tok.decode(ids) !== text) throw new Error(name + ': the package does not round-trip');
  fs.writeFileSync(path.join(here, base + '.pieces'), lengths.join('\n') + '\n');
  console.log(`${name}: ${Buffer.byteLength(text)} bytes, ${ids.length} tokens, ${lengths.length} pieces`);
}

const line = (key) => Buffer.from(key, 'latin1').toString('base64') + ' ' + rank.get(key) + '\n';
const subset = [...seen].sort((a, b) => rank.get(a) - rank.get(b));
fs.writeFileSync(path.join(here, 'llama3_subset.tiktoken'), subset.map(line).join(''));
console.log(`llama3_subset.tiktoken: ${subset.length} tokens`);
if (process.argv[3]) {
  fs.writeFileSync(process.argv[3], bytesOf.map(line).join(''));
  console.log(`${process.argv[3]}: ${bytesOf.length} tokens`);
}
