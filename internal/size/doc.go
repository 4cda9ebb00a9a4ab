// Package size reads the byte sizes esfd and esfctl take on their command
// lines (--max-memory, --memory), so both accept the same spellings.
package size
