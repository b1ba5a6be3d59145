// The globals of the component's JavaScript runtime (StarlingMonkey) this SDK uses, with
// no browser or Node library in scope: what an operator may count on, in a build without
// WASI, is the language (ES2022) and these.

declare class TextEncoder {
  encode(input?: string): Uint8Array;
}

declare class TextDecoder {
  constructor(label?: string, options?: { fatal?: boolean });
  decode(input?: Uint8Array): string;
}
