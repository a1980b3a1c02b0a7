#!/usr/bin/env bash
# Offline checks of the Kubernetes manifests in deploy/k8s.
#
#   check_k8s.sh install WORK_DIR
#       `npm ci` of tests/deploy/k8s/package-lock.json into WORK_DIR (the
#       validator's pinned packages; reused while the lock file is unchanged).
#   check_k8s.sh validate WORK_DIR KUSTOMIZATION_DIR
#       `kubectl kustomize` the directory, then validate.mjs --tessera: API
#       schemas, unknown fields, Tessera invariants.
#   check_k8s.sh self-test WORK_DIR
#       The validator must reject every document of k8s/invalid.yaml and
#       report each mistake of the k8s/broken-* overlays (the messages of
#       their expected-errors.txt); yamllint must reject a badly formatted
#       file.
#   check_k8s.sh flags WORK_DIR BUILD_DIR
#       Each binary parses its flag file from deploy/k8s/base/config (real
#       flag names and values), and rejects a file with an unknown flag.
#
# kubectl: $TESSERA_KUBECTL, else `kubectl` on PATH (Debian's
# kubernetes-client, which scripts/install-deps.sh installs when no kubectl
# is present, or any newer one). Every failure says why.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
cmd=${1:?usage: check_k8s.sh install|validate|self-test WORK_DIR [DIR]}
work=${2:?usage: check_k8s.sh install|validate|self-test WORK_DIR [DIR]}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

need_node() {
  command -v node >/dev/null || fail "node is not installed (scripts/install-deps.sh installs nodejs)"
  [[ -f "${work}/installed.sha256" && -d "${work}/node_modules/kubernetes-models" ]] ||
    fail "validator packages missing in ${work}: run the deploy_k8s_npm_ci test first (check_k8s.sh install)"
  cp "${here}/k8s/validate.mjs" "${work}/validate.mjs"
}

kustomize() {  # kustomize DIR OUT
  local kubectl=${TESSERA_KUBECTL:-$(command -v kubectl)}
  [[ -n ${kubectl} && -x ${kubectl} ]] ||
    fail "kubectl not found; install Debian's kubernetes-client (scripts/install-deps.sh does)"
  echo "kustomize: $("${kubectl}" version --client 2>/dev/null | head -1)"
  if ! "${kubectl}" kustomize "$1" >"$2.tmp" 2>"$2.err"; then
    cat "$2.err" >&2
    fail "kubectl kustomize $1 failed"
  fi
  # Newer kustomize warns about the v2-compatible fields (bases,
  # patchesStrategicMerge); anything else on stderr is shown.
  grep -v -e "^# Warning: '\(bases\|patchesStrategicMerge\|patchesJson6902\)' is deprecated" \
    -e '^$' "$2.err" >&2 || true
  mv "$2.tmp" "$2"
}

case ${cmd} in
  install)
    command -v npm >/dev/null || fail "npm is not installed (scripts/install-deps.sh installs npm)"
    mkdir -p "${work}"
    sum=$(sha256sum "${here}/k8s/package-lock.json" | cut -d' ' -f1)
    if [[ -f "${work}/installed.sha256" && "$(cat "${work}/installed.sha256")" == "${sum}" &&
          -d "${work}/node_modules/kubernetes-models" ]]; then
      echo "validator packages: reusing ${work}/node_modules"
      exit 0
    fi
    rm -f "${work}/installed.sha256"
    cp "${here}/k8s/package.json" "${here}/k8s/package-lock.json" "${work}/"
    echo "validator packages: npm ci in ${work}"
    (cd "${work}" && npm ci --cache "${repo}/tests/.npm-cache" --prefer-offline \
       --no-audit --no-fund --loglevel=error) ||
      fail "npm ci could not install kubernetes-models, @kubernetes-models/prometheus-operator, typescript and yaml (is the npm registry reachable?)"
    echo "${sum}" >"${work}/installed.sha256"
    ;;
  validate)
    dir=${3:?usage: check_k8s.sh validate WORK_DIR KUSTOMIZATION_DIR}
    need_node
    out="${work}/$(basename "${dir}").yaml"
    kustomize "${dir}" "${out}"
    (cd "${work}" && node validate.mjs --tessera "${out}") ||
      fail "$(basename "${dir}"): the rendered manifests (${out}) are not valid"
    ;;
  self-test)
    need_node
    (cd "${work}" && node validate.mjs --expect-invalid "${here}/k8s/invalid.yaml") ||
      fail "the validator accepted a broken document of k8s/invalid.yaml"
    # Every broken-* overlay: each line of its expected-errors.txt must be
    # in an error of the Tessera checks.
    for broken in "${here}"/k8s/broken-*/; do
      name=$(basename "${broken}")
      [[ -f ${broken}/expected-errors.txt ]] || fail "${broken}expected-errors.txt missing"
      expects=()
      while IFS= read -r line; do
        [[ -z ${line} || ${line} == \#* ]] || expects+=("--expect=${line}")
      done <"${broken}/expected-errors.txt"
      [[ ${#expects[@]} -gt 0 ]] || fail "${name}: expected-errors.txt lists nothing"
      kustomize "${broken}" "${work}/${name}.yaml"
      (cd "${work}" && node validate.mjs --tessera --expect-invalid "${expects[@]}" "${work}/${name}.yaml") ||
        fail "the Tessera checks missed a mistake of k8s/${name}"
      echo "ok: k8s/${name}: all ${#expects[@]} mistakes reported"
    done
    [[ -x /usr/bin/yamllint ]] || fail "/usr/bin/yamllint not found; install yamllint (scripts/install-deps.sh does)"
    printf 'spec:\n  ports:  [ 1,2 ]\n  ports: 3\n' >"${work}/lint-bad.yaml"
    if /usr/bin/yamllint -c "${repo}/.yamllint" "${work}/lint-bad.yaml"; then
      fail "yamllint accepted a badly formatted file with a duplicate key"
    fi
    echo "ok: yamllint rejects a badly formatted file"
    ;;
  flags)
    build=${3:?usage: check_k8s.sh flags WORK_DIR BUILD_DIR}
    mkdir -p "${work}"
    for svc in router worker drafter; do
      bin="${build}/services/${svc}/tessera-${svc}"
      file="${repo}/deploy/k8s/base/config/${svc}.flags"
      [[ -x ${bin} ]] || fail "${bin} is not built"
      # --version exits after parsing every flag, the flag file's included.
      if ! out=$("${bin}" --flagfile="${file}" --version 2>&1); then
        echo "${out}" >&2
        fail "tessera-${svc} rejects ${file}"
      fi
      echo "ok: tessera-${svc} parses $(basename "${file}"): ${out}"
      { cat "${file}"; echo "--no_such_flag=1"; } >"${work}/${svc}-bad.flags"
      if "${bin}" --flagfile="${work}/${svc}-bad.flags" --version >/dev/null 2>&1; then
        fail "tessera-${svc} accepted an unknown flag in a flag file; this check is blind"
      fi
    done
    ;;
  *)
    fail "unknown command ${cmd}"
    ;;
esac
