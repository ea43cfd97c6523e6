// llama.cpp as moerl's CPU rollout engine: where its build is (scripts/llamacpp.sh, the one place
// that knows: MOERL_LLAMACPP_DIR or the tools cache) and a policy's conversion from a Hugging
// Face directory to GGUF with llama.cpp's own converter (scripts/llamacpp/convert.py). The
// server itself is supervised by llamacpp-server.ts.
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const script = fileURLToPath(new URL('../../../scripts/llamacpp.sh', import.meta.url));
const converter = fileURLToPath(new URL('../../../scripts/llamacpp/convert.py', import.meta.url));

/** How a missing build is reported; scripts/test.sh matches these exact words under CI. */
export const llamaCppMissingReason = 'llama.cpp not built';

/**
 * The llama.cpp folder (bin/llama-server, convert/) scripts/llamacpp.sh finds, without building
 * it: `{ missing }` says why there is none.
 */
export async function findLlamaCpp(
  env: NodeJS.ProcessEnv = process.env,
): Promise<{ dir: string } | { missing: string }> {
  try {
    const { stdout } = await promisify(execFile)('bash', [script, '--find'], { env });
    return { dir: stdout.trim() };
  } catch (err) {
    const stderr = ((err as { stderr?: string }).stderr ?? '').trim();
    return { missing: stderr.split('\n').pop() || (err as Error).message };
  }
}

export interface GgufConversion {
  /** The llama.cpp folder (findLlamaCpp). */
  llamaCppDir: string;
  /** A Python with torch, transformers, numpy, tqdm and PyYAML (scripts/pyref.sh's has them). */
  python: string;
  /** The Hugging Face model directory (config.json, safetensors, tokenizer). */
  hfDir: string;
  /** The GGUF file to write. */
  out: string;
  /** Tensor type of the file; default f32, moerl's own precision. */
  outType?: 'f32' | 'f16' | 'bf16' | 'q8_0';
  /**
   * The pre-tokenizer to write for a BPE tokenizer llama.cpp does not recognise (one trained by
   * its user, like the tests'); see scripts/llamacpp/convert.py.
   */
  preTokenizer?: string;
  signal?: AbortSignal;
}

/** Writes `out` from `hfDir` with llama.cpp's converter; rejects with the converter's last lines. */
export async function convertToGguf(c: GgufConversion): Promise<void> {
  const args = [converter, c.llamaCppDir, c.hfDir, '--outfile', c.out, '--outtype', c.outType ?? 'f32'];
  if (c.preTokenizer) args.push('--pre-tokenizer', c.preTokenizer);
  try {
    await promisify(execFile)(c.python, args, {
      maxBuffer: 1 << 26,
      // The converter reads the directory only; it must never reach for a model hub.
      env: { ...process.env, HF_HUB_OFFLINE: '1' },
      ...(c.signal ? { signal: c.signal } : {}),
    });
  } catch (err) {
    const stderr = ((err as { stderr?: string }).stderr ?? '').trim().split('\n').slice(-3).join(' | ');
    throw new Error(`GGUF conversion of ${c.hfDir} failed: ${stderr || (err as Error).message}`);
  }
}
