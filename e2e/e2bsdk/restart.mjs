// The unmodified E2B JavaScript SDK (e2b 2.51.0) across an esfd restart.
// Run by e2e TestE2BRestart in two phases around the restart:
//   node restart.mjs before        makes the sandboxes, prints their state
//   node restart.mjs after JSON    checks them after esfd restarted
// with E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL and ESF_E2B_TEMPLATE set
// as for sdk.test.mjs.
import assert from 'node:assert/strict'
import { Sandbox, SandboxNotFoundError } from 'e2b'

const template = process.env.ESF_E2B_TEMPLATE
assert.ok(template, 'ESF_E2B_TEMPLATE is not set')
const opts = { timeoutMs: 10 * 60_000 }

// readWithToken reads a file through envd with an access token an SDK
// handle from before the restart holds.
async function readWithToken(id, token, path) {
  const url = `${process.env.E2B_SANDBOX_URL}/files?path=${encodeURIComponent(path)}`
  const r = await fetch(url, {
    headers: { 'E2b-Sandbox-Id': id, 'X-Access-Token': token, Authorization: 'Basic ' + btoa('user:') },
  })
  return [r.status, await r.text()]
}

const phase = process.argv[2]
if (phase === 'before') {
  const paused = await Sandbox.create(template, { ...opts, envs: { FOO: 'bar' }, metadata: { role: 'paused' } })
  await paused.files.write('/home/user/p', 'paused')
  assert.equal(await paused.pause(), true)
  const running = await Sandbox.create(template, { ...opts, metadata: { role: 'running' } })
  await running.files.write('/home/user/r', 'running')
  const snap = await running.createSnapshot({ name: 'before-restart' })
  const killed = await Sandbox.create(template, opts)
  await killed.kill()
  console.log(
    JSON.stringify({
      paused: paused.sandboxId,
      running: running.sandboxId,
      token: running.envdAccessToken,
      snapshot: snap.snapshotId,
      killed: killed.sandboxId,
    }),
  )
} else if (phase === 'after') {
  const st = JSON.parse(process.argv[3])
  assert.ok(st.token, 'no access token recorded before the restart')
  // The running sandbox runs on: listed, its handle's old token works, a
  // connect answers a handle that works.
  const list = await Sandbox.list({ query: { state: ['running', 'paused'] } }).nextItems()
  const states = Object.fromEntries(list.map((s) => [s.sandboxId, s.state]))
  assert.equal(states[st.running], 'running', JSON.stringify(list))
  assert.equal(states[st.paused], 'paused', JSON.stringify(list))
  assert.equal(states[st.killed], undefined)
  assert.deepEqual(await readWithToken(st.running, st.token, '/home/user/r'), [200, 'running'])
  assert.equal((await readWithToken(st.running, 'not-the-token', '/home/user/r'))[0], 401)
  const running = await Sandbox.connect(st.running, opts)
  assert.equal(await running.files.read('/home/user/r'), 'running')
  assert.equal((await running.getInfo()).metadata.role, 'running')
  // The paused one resumes with its files and envs.
  const paused = await Sandbox.connect(st.paused, opts)
  assert.equal(await paused.files.read('/home/user/p'), 'paused')
  assert.equal((await paused.commands.run('echo $FOO')).stdout, 'bar\n')
  assert.equal((await paused.getInfo()).state, 'running')
  // The snapshot is still listed, and a template.
  const snaps = await running.listSnapshots().nextItems()
  assert.deepEqual(
    snaps.map((s) => s.snapshotId),
    [st.snapshot],
  )
  const from = await Sandbox.create(st.snapshot, opts)
  assert.equal(await from.files.read('/home/user/r'), 'running')
  // The killed one stays gone.
  await assert.rejects(Sandbox.connect(st.killed, opts), SandboxNotFoundError)
  for (const s of [from, running, paused]) await s.kill()
  assert.equal(await Sandbox.deleteSnapshot(st.snapshot), true)
  console.log('ok')
} else {
  throw new Error(`phase ${phase}: want before or after`)
}
