// Writes the reference token ids for tests/unit/tokenizer_test.cc, produced by the npm
// package gpt-tokenizer@4.0.0 (r50k_base) that scripts/fetch_tokenizer.sh caches.
//   node tokenizer_reference.js PACKAGE_DIR OUT.json
// Each case: {"b64": raw bytes (base64), "ids": [...]}. Raw bytes may be invalid UTF-8; the
// reference sees them as JavaScript does (TextDecoder: U+FFFD for each invalid subpart).
'use strict';
const fs = require('fs');
const path = require('path');
const tok = require(path.join(process.argv[2], 'cjs/encoding/r50k_base.js'));

const cases = [
  'Hello world',
  "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
  "I'll say they're here; we've done what you'd've done. DON'T SHOUT'S 'tis",
  'In the beginning God created the heaven and the earth.\n\nAnd the earth was without form, and void.',
  'def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n',
  'int main(int argc, char** argv) {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v[0] == 1 ? 0 : -1;\n}\n',
  '{"key": [1, 2.5e-3, null], "nested": {"a": "b"}}',
  'Zürich, Ærøskøbing, São Paulo, Kraków, İstanbul — naïve café façade',
  '日本語のテキストと中文文本，还有한국어 텍스트。',
  'Привет, мир! Γειά σου κόσμε. مرحبا بالعالم. שלום עולם',
  'Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️‍🔥 and flags 🇺🇸🇯🇵',
  'a  b   c    d\t\te\n\n\nf \n g   \n\n  h',
  '                                                                                 x',
  'trailing spaces   ',
  '\n\n\n\n',
  'non\u00a0breaking\u3000ideographic\u2003em\ufeffbom\u2028line\u2029para',
  // U+FEFF is whitespace to JavaScript's \s (not to PCRE2's): these splits depend on it.
  'a \ufeffb  \ufeff\ufeff x\ufeff \ufeff\n\ufeff',
  'zero\u200bwidth \u200bjoiner \u00a0 \u00a0x',
  'Numbers 123 4567 89012345 3.14159 1,000,000 0x1F 1e10 ½ ² ٣ ۴ ५',
  '!!!???...;;;:::--- ___ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}',
  'supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis',
  'URLs: https://example.com/path?query=1&b=2#frag mailto:someone@example.org',
  "mixed'case's 'S 'T 'RE 'Ve 'LL 'D",
  '',
];
const out = [];
for (const s of cases) out.push({ b64: Buffer.from(s, 'utf8').toString('base64'), ids: tok.encode(s) });

// Invalid UTF-8: lone continuation bytes, truncated sequences, overlongs, surrogates, 0xFF.
const invalid = [
  [0x61, 0x80, 0x62],
  [0xc3, 0x28, 0x41],
  [0xe2, 0x82, 0x20, 0x78],
  [0xf0, 0x9f, 0x98, 0x20, 0x79],
  [0xc0, 0xaf, 0x2f],
  [0xed, 0xa0, 0x80, 0x41],
  [0xff, 0xfe, 0x41, 0x42],
  [0x48, 0x69, 0xf4, 0x90, 0x80, 0x80, 0x21],
  [0x20, 0x20, 0xe0, 0x80, 0x80, 0x20, 0x7a],
];
const dec = new TextDecoder('utf-8');
for (const b of invalid) {
  const buf = Buffer.from(b);
  out.push({ b64: buf.toString('base64'), ids: tok.encode(dec.decode(buf)) });
}

// Random strings over a mixed alphabet (seeded), to reach the corners the list misses.
let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
const alphabet = [...'abcdefghijklmnopqrstuvwxyz ABCDEFXYZ0123456789 \t\n.,;:\'"!?-_()[]{}<>/\\@#$%^&*+=~`|',
                  'é', 'ß', 'ü', 'ñ', '中', '文', 'ä', '😀', '👍', '\u00a0', '\u3000', 'λ', 'Ж', '١', '\u200b'];
for (let k = 0; k < 300; ++k) {
  let s = '';
  const len = 1 + Math.floor(rnd() * 60);
  for (let i = 0; i < len; ++i) s += alphabet[Math.floor(rnd() * alphabet.length)];
  out.push({ b64: Buffer.from(s, 'utf8').toString('base64'), ids: tok.encode(s) });
}
fs.writeFileSync(process.argv[3], JSON.stringify(out));
console.log(`wrote ${out.length} reference cases to ${process.argv[3]}`);
