// The unmodified E2B JavaScript SDK (e2b 2.51.0) against esfd's E2B front
// door. Run by e2e TestE2BSDK, which starts esfd and sets E2B_API_KEY,
// E2B_API_URL and E2B_SANDBOX_URL (all the SDK needs) and ESF_E2B_TEMPLATE
// (a group of a busybox + static bash rootfs).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import {
  Sandbox,
  CommandExitError,
  AuthenticationError,
  NotFoundError,
  SandboxNotFoundError,
  FileType,
} from 'e2b'

const template = process.env.ESF_E2B_TEMPLATE
assert.ok(template, 'ESF_E2B_TEMPLATE is not set')
const opts = { timeoutMs: 10 * 60_000 }
const live = []

async function create(tmpl = template, extra = {}) {
  const sbx = await Sandbox.create(tmpl, { ...opts, ...extra })
  live.push(sbx)
  return sbx
}

after(async () => {
  for (const sbx of live) {
    try {
      await sbx.kill()
    } catch {}
  }
})

test('commands: stdout, stderr, exit codes, env, cwd', async () => {
  const sbx = await create(template, { envs: { GREETING: 'hello' }, metadata: { suite: 'commands' } })
  const r = await sbx.commands.run('echo $GREETING; echo oops >&2; pwd')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\n/home/user\n')
  assert.equal(r.stderr, 'oops\n')
  await assert.rejects(sbx.commands.run('echo partial; exit 3'), (err) => {
    assert.ok(err instanceof CommandExitError, `got ${err}`)
    assert.equal(err.exitCode, 3)
    assert.equal(err.stdout, 'partial\n')
    return true
  })
  const r2 = await sbx.commands.run('echo $X; pwd', { envs: { X: 'y' }, cwd: '/tmp' })
  assert.equal(r2.stdout, 'y\n/tmp\n')
  // bash is a real bash: arrays work.
  const r3 = await sbx.commands.run('a=(1 2 3); echo ${#a[@]} $BASH_VERSION | cut -c1-3')
  assert.equal(r3.stdout, '3 5\n')
})

test('commands: background, list, connect, kill; stdin', async () => {
  const sbx = await create()
  const h = await sbx.commands.run('echo started; sleep 1000', { background: true })
  const procs = await sbx.commands.list()
  assert.ok(procs.some((p) => p.pid === h.pid), JSON.stringify(procs))
  let seen = ''
  const again = await sbx.commands.connect(h.pid, { onStdout: (d) => (seen += d) })
  assert.equal(await sbx.commands.kill(h.pid), true)
  await assert.rejects(again.wait(), CommandExitError)
  assert.equal(await sbx.commands.kill(h.pid), false)

  const cat = await sbx.commands.run('cat; echo done', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'hello ')
  await sbx.commands.sendStdin(cat.pid, 'stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  const r = await cat.wait()
  assert.equal(r.stdout, 'hello stdin\ndone\n')
})

test('pty: create, resize, input, exit', async () => {
  const sbx = await create()
  let out = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (out += dec.decode(d)) })
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; exit 5\n'))
  await assert.rejects(term.wait(), (err) => err instanceof CommandExitError && err.exitCode === 5)
  assert.match(out, /30 100/)
})

test('files: every call, signed URLs, confinement', async () => {
  const sbx = await create()
  await sbx.files.write('notes/a.txt', 'alpha')
  await sbx.files.write([
    { path: '/tmp/m1', data: 'one' },
    { path: '/tmp/m2', data: new Blob(['two']) },
  ])
  assert.equal(await sbx.files.read('notes/a.txt'), 'alpha')
  assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'alpha')
  assert.equal((await sbx.commands.run('cat /tmp/m1 /tmp/m2')).stdout, 'onetwo')
  assert.equal(await sbx.files.exists('/tmp/m1'), true)
  assert.equal(await sbx.files.exists('/tmp/nope'), false)
  const info = await sbx.files.getInfo('/tmp/m1')
  assert.equal(info.type, FileType.FILE)
  assert.equal(info.size, 3)
  assert.equal(await sbx.files.makeDir('/tmp/d/e'), true)
  assert.equal(await sbx.files.makeDir('/tmp/d/e'), false)
  await sbx.commands.run('touch /tmp/d/e/f /tmp/d/g')
  const one = (await sbx.files.list('/tmp/d')).map((e) => e.path).sort()
  assert.deepEqual(one, ['/tmp/d/e', '/tmp/d/g'])
  const two = (await sbx.files.list('/tmp/d', { depth: 2 })).map((e) => e.path).sort()
  assert.deepEqual(two, ['/tmp/d/e', '/tmp/d/e/f', '/tmp/d/g'])
  const moved = await sbx.files.rename('/tmp/m1', '/tmp/d/moved')
  assert.equal(moved.path, '/tmp/d/moved')
  await sbx.files.remove('/tmp/d/e')
  assert.equal((await sbx.commands.run('ls /tmp/d')).stdout, 'g\nmoved\n')
  await assert.rejects(sbx.files.read('/tmp/nope'), NotFoundError)
  // Confined: the host's /etc is not the sandbox's.
  await sbx.commands.run('ln -s / /tmp/escape')
  await assert.rejects(sbx.files.read('/tmp/escape/../../etc/hostname'), NotFoundError)

  const events = []
  const watch = await sbx.files.watchDir('/tmp/w', (e) => events.push(e), { recursive: false }).catch(async (err) => {
    // The directory must exist first.
    await sbx.files.makeDir('/tmp/w')
    return sbx.files.watchDir('/tmp/w', (e) => events.push(e))
  })
  await sbx.commands.run('echo x > /tmp/w/new')
  for (let i = 0; i < 600 && !events.some((e) => e.name === 'new'); i++) {
    await new Promise((r) => setTimeout(r, 100))
  }
  await watch.stop()
  assert.ok(events.some((e) => e.name === 'new'), JSON.stringify(events))

  // Signed URLs carry no token and no sandbox id.
  const secured = sbx
  await secured.files.write('/tmp/signed', 'signed content')
  const down = await secured.downloadUrl('/tmp/signed', { useSignatureExpiration: 60_000 })
  const res = await fetch(down)
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'signed content')
  const up = await secured.uploadUrl('/tmp/uploaded')
  const form = new FormData()
  form.append('file', new Blob(['via url']), '/tmp/uploaded')
  const put = await fetch(up, { method: 'POST', body: form })
  assert.equal(put.status, 200, await put.text())
  assert.equal(await secured.files.read('/tmp/uploaded'), 'via url')
  const bad = new URL(down)
  bad.searchParams.set('signature', 'v1_bad')
  assert.equal((await fetch(bad)).status, 401)
})

test('pause, connect: the files are still there', async () => {
  const sbx = await create()
  await sbx.files.write('/home/user/kept', 'kept')
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.pause(), false) // already paused
  assert.equal((await sbx.getInfo()).state, 'paused')
  const listed = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
  assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId && s.state === 'paused'), JSON.stringify(listed))
  const back = await Sandbox.connect(sbx.sandboxId, opts)
  assert.equal(await back.files.read('/home/user/kept'), 'kept')
  assert.equal((await back.getInfo()).state, 'running')
})

test('fork: 3 children that share no writable delta', async () => {
  const sbx = await create()
  await sbx.files.write('/home/user/base', 'base')
  const kids = await sbx.fork({ count: 3, timeoutMs: 600_000 })
  assert.equal(kids.length, 3)
  for (const k of kids) {
    assert.ok(k instanceof Sandbox, `${k}`)
    live.push(k)
  }
  await Promise.all(kids.map((k, i) => k.files.write(`/home/user/child${i}`, `${i}`)))
  for (const [i, k] of kids.entries()) {
    const r = await k.commands.run('cat base; echo; ls /home/user')
    assert.equal(r.stdout, `base\nbase\nchild${i}\n`)
  }
  assert.equal((await sbx.commands.run('ls /home/user')).stdout, 'base\n')
})

test('snapshot: create from it; list; delete', async () => {
  const sbx = await create()
  await sbx.files.write('/home/user/s', 'snap')
  const snap = await sbx.createSnapshot({ name: 'mine' })
  assert.ok(snap.snapshotId)
  assert.deepEqual(snap.names, ['mine'])
  const snaps = await sbx.listSnapshots().nextItems()
  assert.deepEqual(
    snaps.map((s) => s.snapshotId),
    [snap.snapshotId],
  )
  await sbx.files.remove('/home/user/s')
  const from = await create(snap.snapshotId)
  assert.equal(await from.files.read('/home/user/s'), 'snap')
  await from.kill()
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  // The SDK reports a 404 on create as a SandboxError naming the status.
  await assert.rejects(Sandbox.create(snap.snapshotId, opts), /404: template .* not found/)
})

test('list, get info, set timeout, kill; two sandboxes at once', async () => {
  const tag = `t${Date.now()}`
  const [a, b] = await Promise.all([
    create(template, { metadata: { tag, n: 'a' } }),
    create(template, { metadata: { tag, n: 'b' } }),
  ])
  const [ra, rb] = await Promise.all([
    a.commands.run('echo a > /home/user/who; sleep 1; cat /home/user/who'),
    b.commands.run('echo b > /home/user/who; sleep 1; cat /home/user/who'),
  ])
  assert.equal(ra.stdout, 'a\n')
  assert.equal(rb.stdout, 'b\n')

  const pager = Sandbox.list({ query: { metadata: { tag } }, limit: 1 })
  const ids = []
  while (pager.hasNext) {
    for (const s of await pager.nextItems()) ids.push(s.sandboxId)
  }
  assert.deepEqual(ids.sort(), [a.sandboxId, b.sandboxId].sort())

  const info = await a.getInfo()
  assert.equal(info.sandboxId, a.sandboxId)
  assert.equal(info.metadata.n, 'a')
  assert.equal(info.state, 'running')
  await a.setTimeout(3_600_000)
  const later = await a.getInfo()
  assert.ok(later.endAt.getTime() - Date.now() > 3_000_000, `${later.endAt}`)

  await a.kill()
  await assert.rejects(Sandbox.getInfo(a.sandboxId), NotFoundError)
  assert.equal(await Sandbox.kill(a.sandboxId), false)
  await assert.rejects(Sandbox.connect(a.sandboxId, opts), SandboxNotFoundError)
})

test('401: a bad API key, a bad access token', async () => {
  await assert.rejects(Sandbox.create(template, { ...opts, apiKey: 'e2b_00000000000000000000000000000000' }), AuthenticationError)
  const sbx = await create()
  const forged = new Sandbox({
    sandboxId: sbx.sandboxId,
    envdVersion: '0.6.4',
    envdAccessToken: 'not-the-token',
  })
  await assert.rejects(forged.commands.run('true'), AuthenticationError)
})

test('users, getHost, metrics', async () => {
  const sbx = await create()
  // Both users run as the container's root; each has its home.
  assert.equal((await sbx.commands.run('id -u; echo $HOME; pwd')).stdout, '0\n/home/user\n/home/user\n')
  assert.equal((await sbx.commands.run('id -u; echo $HOME; pwd', { user: 'root' })).stdout, '0\n/root\n/root\n')
  // getHost builds PORT-ID.DOMAIN from esfd --e2b-domain.
  assert.equal(sbx.getHost(8080), `8080-${sbx.sandboxId}.${process.env.ESF_E2B_DOMAIN}`)
  const m = await sbx.getMetrics()
  assert.equal(m.length, 1)
  assert.ok(m[0].cpuCount >= 1 && m[0].memTotal > 0 && m[0].memUsed > 0, JSON.stringify(m))
})

test('autoPause: a sandbox whose timeout passes is paused, and resumes with its files', async () => {
  const sbx = await Sandbox.create(template, { timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' } })
  live.push(sbx)
  await sbx.files.write('/home/user/auto', 'auto')
  assert.equal((await sbx.getInfo()).lifecycle?.onTimeout, 'pause')
  let state = 'running'
  for (let i = 0; i < 1200 && state !== 'paused'; i++) {
    await new Promise((r) => setTimeout(r, 100))
    state = (await sbx.getInfo()).state
  }
  assert.equal(state, 'paused')
  const back = await Sandbox.connect(sbx.sandboxId, opts)
  assert.equal(await back.files.read('/home/user/auto'), 'auto')
})

test('refused: internet access, memory snapshots', async () => {
  await assert.rejects(Sandbox.create(template, { ...opts, allowInternetAccess: true }), /allow_internet_access/)
  const sbx = await create()
  await assert.rejects(sbx.pause({ keepMemory: true }), /memory/)
})
