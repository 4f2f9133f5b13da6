// A QR code encoder (ISO/IEC 18004) for the join URL: byte mode, error correction level M,
// versions 1 to 10 (up to 213 bytes), the mask of least penalty among all eight. Written
// for this page, nothing loaded from elsewhere. window.DaisyQR.encode(text) gives the
// module matrix; DaisyQR.svg(text) an <svg> element that draws it with its quiet zone.
'use strict';

(function () {
  // Per version 1..10 at level M: [total codewords, EC codewords per block,
  // [blocks, data codewords each], ...]. The standard's table 9.
  const kBlocksM = [
    null,
    [26, 10, [1, 16]],
    [44, 16, [1, 28]],
    [70, 26, [1, 44]],
    [100, 18, [2, 32]],
    [134, 24, [2, 43]],
    [172, 16, [4, 27]],
    [196, 18, [4, 31]],
    [242, 22, [2, 38], [2, 39]],
    [292, 22, [3, 36], [2, 37]],
    [346, 26, [4, 43], [1, 44]],
  ];
  // Centres of the alignment patterns, per version (rows and columns alike).
  const kAlign = [null, [], [6, 18], [6, 22], [6, 26], [6, 30], [6, 34], [6, 22, 38], [6, 24, 42], [6, 26, 46],
    [6, 28, 50]];
  // Bits left over after the last codeword (versions 2 to 6 have 7).
  const kRemainder = [0, 0, 7, 7, 7, 7, 7, 0, 0, 0, 0];
  const kLevelM = 0;  // the two error-correction bits of the format information (L 01, M 00, Q 11, H 10)

  function dataCodewords(version) {
    let n = 0;
    for (const [blocks, each] of kBlocksM[version].slice(2)) n += blocks * each;
    return n;
  }

  // ---- Reed-Solomon over GF(256), polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d) ----
  const kExp = new Uint8Array(512);
  const kLog = new Uint8Array(256);
  (function () {
    let x = 1;
    for (let i = 0; i < 255; i++) {
      kExp[i] = x;
      kLog[x] = i;
      x <<= 1;
      if (x & 0x100) x ^= 0x11d;
    }
    for (let i = 255; i < 512; i++) kExp[i] = kExp[i - 255];
  })();
  const mul = (a, b) => (a === 0 || b === 0 ? 0 : kExp[kLog[a] + kLog[b]]);

  // The generator (x - a^0)(x - a^1)...(x - a^(n-1)), highest power first, leading 1 dropped.
  function generator(n) {
    let g = [1];
    for (let i = 0; i < n; i++) {
      const next = new Array(g.length + 1).fill(0);
      for (let j = 0; j < g.length; j++) {
        next[j] ^= g[j];
        next[j + 1] ^= mul(g[j], kExp[i]);
      }
      g = next;
    }
    return g.slice(1);
  }

  // The n error-correction codewords of `data`: the remainder of data(x) * x^n by g(x).
  function ecCodewords(data, n) {
    const g = generator(n);
    const rem = new Array(n).fill(0);
    for (const byte of data) {
      const factor = byte ^ rem[0];
      rem.shift();
      rem.push(0);
      for (let i = 0; i < n; i++) rem[i] ^= mul(g[i], factor);
    }
    return rem;
  }

  // ---- the bit stream: mode, length, bytes, terminator, padding, blocks interleaved ----
  function codewords(bytes, version) {
    const bits = [];
    const put = (value, n) => {
      for (let i = n - 1; i >= 0; i--) bits.push((value >>> i) & 1);
    };
    put(0b0100, 4);                            // byte mode
    put(bytes.length, version <= 9 ? 8 : 16);  // character count
    for (const b of bytes) put(b, 8);
    const capacity = dataCodewords(version) * 8;
    put(0, Math.min(4, capacity - bits.length));  // terminator
    while (bits.length % 8) bits.push(0);
    const data = [];
    for (let i = 0; i < bits.length; i += 8) data.push(bits.slice(i, i + 8).reduce((a, b) => (a << 1) | b, 0));
    for (let pad = 0; data.length < capacity / 8; pad ^= 1) data.push(pad ? 0x11 : 0xec);

    const [, ecLen, ...groups] = kBlocksM[version];
    const blocks = [];
    let at = 0;
    for (const [count, each] of groups) {
      for (let b = 0; b < count; b++) {
        const d = data.slice(at, at + each);
        at += each;
        blocks.push({ data: d, ec: ecCodewords(d, ecLen) });
      }
    }
    const out = [];
    const longest = Math.max(...blocks.map((b) => b.data.length));
    for (let i = 0; i < longest; i++)
      for (const b of blocks)
        if (i < b.data.length) out.push(b.data[i]);
    for (let i = 0; i < ecLen; i++)
      for (const b of blocks) out.push(b.ec[i]);
    return out;
  }

  // ---- the matrix ----
  // Modules are 1 (dark) or 0 (light); `fixed` marks function patterns and reserved areas.
  class Matrix {
    constructor(version) {
      this.version = version;
      this.size = 17 + 4 * version;
      this.dark = Array.from({ length: this.size }, () => new Uint8Array(this.size));
      this.fixed = Array.from({ length: this.size }, () => new Uint8Array(this.size));
    }
    set(row, col, dark) {
      this.dark[row][col] = dark ? 1 : 0;
      this.fixed[row][col] = 1;
    }
    clone() {
      const m = new Matrix(this.version);
      m.dark = this.dark.map((r) => r.slice());
      m.fixed = this.fixed;
      return m;
    }
  }

  function placeFinder(m, top, left) {
    // 7x7 rings (dark, light, dark 3x3) and the light separator around them.
    for (let dr = -1; dr <= 7; dr++) {
      for (let dc = -1; dc <= 7; dc++) {
        const r = top + dr;
        const c = left + dc;
        if (r < 0 || c < 0 || r >= m.size || c >= m.size) continue;
        const ring = Math.max(Math.abs(dr - 3), Math.abs(dc - 3));
        m.set(r, c, ring !== 2 && ring !== 4);
      }
    }
  }

  function placeFunctionPatterns(m) {
    const n = m.size;
    placeFinder(m, 0, 0);
    placeFinder(m, 0, n - 7);
    placeFinder(m, n - 7, 0);
    for (let i = 8; i < n - 8; i++) {  // timing patterns
      m.set(6, i, i % 2 === 0);
      m.set(i, 6, i % 2 === 0);
    }
    const centres = kAlign[m.version];
    for (const r of centres) {
      for (const c of centres) {
        // Not over the finder patterns' corners.
        if ((r === 6 && c === 6) || (r === 6 && c === n - 7) || (r === n - 7 && c === 6)) continue;
        for (let dr = -2; dr <= 2; dr++)
          for (let dc = -2; dc <= 2; dc++) m.set(r + dr, c + dc, Math.max(Math.abs(dr), Math.abs(dc)) !== 1);
      }
    }
    placeFormat(m, 0);  // reserves the areas; the real bits come with the mask
    if (m.version >= 7) placeVersion(m);
  }

  // BCH remainder of `value` (already shifted up) by `poly` of degree `degree`.
  function bchRemainder(value, poly, degree) {
    for (let bit = 31 - Math.clz32(value); bit >= degree; bit--)
      if ((value >>> bit) & 1) value ^= poly << (bit - degree);
    return value;
  }

  // The 15 format bits for level M and `mask`: 5 data bits, BCH(15,5) with
  // x^10+x^8+x^5+x^4+x^2+x+1, XOR 101010000010010.
  function formatBits(mask) {
    const data = (kLevelM << 3) | mask;
    return ((data << 10) | bchRemainder(data << 10, 0x537, 10)) ^ 0x5412;
  }

  function placeFormat(m, mask) {
    const bits = formatBits(mask);
    const bit = (i) => (bits >>> i) & 1;
    const n = m.size;
    // Beside the top-left finder: down column 8, then left along row 8 (skipping timing).
    for (let i = 0; i <= 5; i++) m.set(i, 8, bit(i));
    m.set(7, 8, bit(6));
    m.set(8, 8, bit(7));
    m.set(8, 7, bit(8));
    for (let i = 9; i < 15; i++) m.set(8, 14 - i, bit(i));
    // The second copy: along row 8 under the top-right finder, up column 8 beside the
    // bottom-left one, and the module that is always dark.
    for (let i = 0; i < 8; i++) m.set(8, n - 1 - i, bit(i));
    for (let i = 8; i < 15; i++) m.set(n - 15 + i, 8, bit(i));
    m.set(n - 8, 8, 1);
  }

  // Versions 7 and up: 6 version bits and a BCH(18,6) remainder by 0x1f25, twice (3x6 blocks).
  function placeVersion(m) {
    const v = m.version;
    const bits = (v << 12) | bchRemainder(v << 12, 0x1f25, 12);
    for (let i = 0; i < 18; i++) {
      const dark = (bits >>> i) & 1;
      const a = m.size - 11 + (i % 3);
      const b = Math.floor(i / 3);
      m.set(b, a, dark);
      m.set(a, b, dark);
    }
  }

  // The codewords' bits, most significant first, in the zig-zag of two-module columns from
  // the bottom-right corner, up then down, skipping the vertical timing column.
  function placeData(m, words) {
    const n = m.size;
    const total = words.length * 8 + kRemainder[m.version];
    let k = 0;
    let upward = true;
    for (let right = n - 1; right >= 1; right -= 2) {
      if (right === 6) right = 5;
      for (let step = 0; step < n; step++) {
        const row = upward ? n - 1 - step : step;
        for (const col of [right, right - 1]) {
          if (m.fixed[row][col]) continue;
          m.dark[row][col] = k < words.length * 8 ? (words[k >>> 3] >>> (7 - (k & 7))) & 1 : 0;
          k++;
        }
      }
      upward = !upward;
    }
    if (k !== total) throw new Error('Bug: QR data placement filled ' + k + ' modules, expected ' + total);
  }

  const kMasks = [
    (r, c) => (r + c) % 2 === 0,
    (r) => r % 2 === 0,
    (r, c) => c % 3 === 0,
    (r, c) => (r + c) % 3 === 0,
    (r, c) => (Math.floor(r / 2) + Math.floor(c / 3)) % 2 === 0,
    (r, c) => ((r * c) % 2) + ((r * c) % 3) === 0,
    (r, c) => (((r * c) % 2) + ((r * c) % 3)) % 2 === 0,
    (r, c) => (((r + c) % 2) + ((r * c) % 3)) % 2 === 0,
  ];

  function applyMask(m, mask) {
    const f = kMasks[mask];
    for (let r = 0; r < m.size; r++)
      for (let c = 0; c < m.size; c++)
        if (!m.fixed[r][c] && f(r, c)) m.dark[r][c] ^= 1;
  }

  // The standard's penalty: runs of five or more (3 + the excess), 2x2 blocks of one colour
  // (3 each), finder-like 1:1:3:1:1 runs with four light modules on a side (40 each; outside
  // the symbol counts as light), and 10 per 5 % the dark share is away from 50 %.
  function penalty(m) {
    const n = m.size;
    const at = (r, c, byRow) => (byRow ? m.dark[r][c] : m.dark[c][r]);
    let score = 0;
    for (const byRow of [true, false]) {
      for (let i = 0; i < n; i++) {
        let run = 1;
        for (let j = 1; j <= n; j++) {
          if (j < n && at(i, j, byRow) === at(i, j - 1, byRow)) {
            run++;
            continue;
          }
          if (run >= 5) score += 3 + (run - 5);
          run = 1;
        }
        const get = (j) => (j < 0 || j >= n ? 0 : at(i, j, byRow));
        for (let j = 0; j + 7 <= n; j++) {
          if (!(get(j) && !get(j + 1) && get(j + 2) && get(j + 3) && get(j + 4) && !get(j + 5) && get(j + 6))) continue;
          const lightBefore = !get(j - 1) && !get(j - 2) && !get(j - 3) && !get(j - 4);
          const lightAfter = !get(j + 7) && !get(j + 8) && !get(j + 9) && !get(j + 10);
          if (lightBefore) score += 40;
          if (lightAfter) score += 40;
        }
      }
    }
    let dark = 0;
    for (let r = 0; r < n; r++) {
      for (let c = 0; c < n; c++) {
        dark += m.dark[r][c];
        if (r + 1 < n && c + 1 < n) {
          const v = m.dark[r][c];
          if (m.dark[r][c + 1] === v && m.dark[r + 1][c] === v && m.dark[r + 1][c + 1] === v) score += 3;
        }
      }
    }
    score += 10 * Math.floor(Math.abs((dark * 100) / (n * n) - 50) / 5);
    return score;
  }

  // {version, mask, size, modules: rows of 0/1} for `text` (UTF-8), the smallest version
  // that holds it. Throws when it is longer than version 10 holds at level M (213 bytes).
  // options.mask (0..7) forces a mask instead of the one of least penalty (for tests).
  function encode(text, options = {}) {
    const bytes = Array.from(new TextEncoder().encode(String(text)));
    let version = 0;
    for (let v = 1; v <= 10 && !version; v++) {
      const header = 4 + (v <= 9 ? 8 : 16);
      if (header + bytes.length * 8 <= dataCodewords(v) * 8) version = v;
    }
    if (!version) throw new Error('the text is ' + bytes.length + ' bytes: a QR code of version 10 at level M holds 213');
    const words = codewords(bytes, version);
    const base = new Matrix(version);
    placeFunctionPatterns(base);
    placeData(base, words);
    let best = null;
    const forced = Number.isInteger(options.mask) && options.mask >= 0 && options.mask < 8;
    for (let mask = forced ? options.mask : 0; mask < (forced ? options.mask + 1 : 8); mask++) {
      const m = base.clone();
      applyMask(m, mask);
      placeFormat(m, mask);
      const p = penalty(m);
      if (!best || p < best.penalty) best = { penalty: p, mask, m };
    }
    return { version, mask: best.mask, size: best.m.size, modules: best.m.dark.map((r) => Array.from(r)) };
  }

  // An <svg> of the code for `text`: `scale` pixels a module, a quiet zone of 4 modules,
  // crisp edges, dark on white whatever the page's colours (scanners want that).
  function svg(text, scale = 6, options = {}) {
    const q = encode(text, options);
    const side = q.size + 8;
    const ns = 'http://www.w3.org/2000/svg';
    const root = document.createElementNS(ns, 'svg');
    root.setAttribute('viewBox', `0 0 ${side} ${side}`);
    root.setAttribute('width', String(side * scale));
    root.setAttribute('height', String(side * scale));
    root.setAttribute('shape-rendering', 'crispEdges');
    root.setAttribute('role', 'img');
    const bg = document.createElementNS(ns, 'rect');
    bg.setAttribute('width', String(side));
    bg.setAttribute('height', String(side));
    bg.setAttribute('fill', '#fff');
    root.append(bg);
    let d = '';
    for (let r = 0; r < q.size; r++)
      for (let c = 0; c < q.size; c++)
        if (q.modules[r][c]) d += `M${c + 4} ${r + 4}h1v1h-1z`;
    const path = document.createElementNS(ns, 'path');
    path.setAttribute('d', d);
    path.setAttribute('fill', '#000');
    root.append(path);
    root.dataset.version = String(q.version);
    root.dataset.mask = String(q.mask);
    return root;
  }

  window.DaisyQR = { encode, svg };
})();
