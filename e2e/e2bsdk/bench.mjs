// A driver for bench/ (scenario e2b): reads one command per line on stdin
// and answers one line on stdout with the milliseconds its timed part
// took, so that the Go side can interleave it with its baseline.
//   create  Sandbox.create + the first commands.run('true') (the kill after is not timed)
//   fork    Sandbox.fork({count: 4}) of a running sandbox (its creation and the kills are not timed)
// Environment: what the SDK reads (E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL) and ESF_E2B_TEMPLATE.
import { createInterface } from 'node:readline'
import { Sandbox } from 'e2b'

const template = process.env.ESF_E2B_TEMPLATE
const opts = { timeoutMs: 600_000 }

async function create() {
  const t0 = performance.now()
  const sbx = await Sandbox.create(template, opts)
  await sbx.commands.run('true')
  const ms = performance.now() - t0
  await sbx.kill()
  return ms
}

async function fork() {
  const sbx = await Sandbox.create(template, opts)
  const t0 = performance.now()
  const kids = await sbx.fork({ count: 4, timeoutMs: 600_000 })
  const ms = performance.now() - t0
  for (const k of kids) {
    if (!(k instanceof Sandbox)) throw k
    await k.kill()
  }
  await sbx.kill()
  return ms
}

const rl = createInterface({ input: process.stdin })
for await (const line of rl) {
  try {
    const ms = line === 'create' ? await create() : line === 'fork' ? await fork() : NaN
    console.log(Number.isNaN(ms) ? `error unknown command ${line}` : `${ms}`)
  } catch (err) {
    console.log(`error ${String(err).replaceAll('\n', ' ')}`)
  }
}
