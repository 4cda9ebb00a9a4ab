package wasitest

import "encoding/binary"

// Module is a hand-assembled WASI command: one function, exported as
// _start, over an optional memory. It shows what a Go guest cannot (a
// trap, a memory minimum above a limit) and measures Run without a guest
// runtime's start-up.

type Module struct {
	ImportExit   bool   // import wasi_snapshot_preview1.proc_exit as function 0
	MemMin       uint32 // pages; the memory exists when MemMin or MemMax > 0
	MemMax       uint32 // 0: no maximum
	ExportMemory bool   // export the memory as "memory", as WASI expects
	Start        []byte // instructions of the function, without the final end
	NoStart      bool   // export the function as "main" instead of "_start"
	ExtraImport  string // also import "env" <name> () -> (), which WASI lacks
}

const (
	typeI32 = 0 // (i32) -> ()
	typeNil = 1 // () -> ()
)

// Bytes encodes the module.
func (m Module) Bytes() []byte {
	b := []byte("\x00asm\x01\x00\x00\x00")
	b = section(b, 1, vec([]byte{0x60, 1, 0x7f, 0}, []byte{0x60, 0, 0}))
	var imports [][]byte
	if m.ImportExit {
		imports = append(imports, cat(name("wasi_snapshot_preview1"), name("proc_exit"), []byte{0, typeI32}))
	}
	if m.ExtraImport != "" {
		imports = append(imports, cat(name("env"), name(m.ExtraImport), []byte{0, typeNil}))
	}
	if len(imports) > 0 {
		b = section(b, 2, vec(imports...))
	}
	b = section(b, 3, vec([]byte{typeNil}))
	if m.MemMin > 0 || m.MemMax > 0 {
		lim := []byte{0}
		lim = binary.AppendUvarint(lim, uint64(m.MemMin))
		if m.MemMax > 0 {
			lim[0] = 1
			lim = binary.AppendUvarint(lim, uint64(m.MemMax))
		}
		b = section(b, 5, vec(lim))
	}
	fn := byte(len(imports)) // the defined function follows the imports
	entry := "_start"
	if m.NoStart {
		entry = "main"
	}
	exports := [][]byte{cat(name(entry), []byte{0, fn})}
	if m.ExportMemory {
		exports = append(exports, cat(name("memory"), []byte{2, 0}))
	}
	b = section(b, 7, vec(exports...))
	body := cat([]byte{0}, m.Start, []byte{0x0b}) // no locals
	b = section(b, 10, vec(cat(binary.AppendUvarint(nil, uint64(len(body))), body)))
	return b
}

func section(b []byte, id byte, content []byte) []byte {
	b = append(b, id)
	b = binary.AppendUvarint(b, uint64(len(content)))
	return append(b, content...)
}

func vec(items ...[]byte) []byte {
	b := binary.AppendUvarint(nil, uint64(len(items)))
	for _, it := range items {
		b = append(b, it...)
	}
	return b
}

func name(s string) []byte { return append(binary.AppendUvarint(nil, uint64(len(s))), s...) }

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// I32Const encodes the instruction i32.const v.
func I32Const(v int32) []byte {
	b := []byte{0x41}
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// ExitModule is a WASI command that calls proc_exit(code) at once: the
// smallest module that exercises the WASI import.
func ExitModule(code int32) []byte {
	return Module{ImportExit: true, MemMin: 1, ExportMemory: true,
		Start: cat(I32Const(code), []byte{0x10, 0})}.Bytes() // call 0
}

// TrapModule executes unreachable.
func TrapModule() []byte {
	return Module{MemMin: 1, ExportMemory: true, Start: []byte{0x00}}.Bytes()
}

// LoopModule spins forever in a loop that makes no call.
func LoopModule() []byte {
	return Module{MemMin: 1, ExportMemory: true, Start: []byte{0x03, 0x40, 0x0c, 0x00, 0x0b}}.Bytes() // loop br 0 end
}
