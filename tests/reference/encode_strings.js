// GPT-2 token ids of strings from the npm package gpt-tokenizer@4.0.0 (r50k_base), the
// reference tokenizer scripts/fetch_tokenizer.sh caches.
//   node encode_strings.js PACKAGE_DIR IN.json OUT.json     (IN: ["text", ...])
'use strict';
const fs = require('fs');
const path = require('path');
const tok = require(path.join(process.argv[2], 'cjs/encoding/r50k_base.js'));
const strings = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
fs.writeFileSync(process.argv[4], JSON.stringify(strings.map((s) => tok.encode(s))));
