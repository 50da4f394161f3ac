# Sourced by the bench scripts that time PyTorch with OpenBLAS (forward_vs_pytorch.sh,
# gpt_train_vs_pytorch.sh): Debian's python3-torch uses the reference BLAS, so the fair peer for
# matrix products is torch with Debian's OpenMP build of OpenBLAS first on the library path.
# Reads CACHE, OPENBLAS_DIR and FETCH_OPENBLAS; with FETCH_OPENBLAS=1 and no
# $OPENBLAS_DIR/libblas.so.3, unpacks `apt-get download libopenblas0-openmp` into
# $CACHE/openblas (no root needed). Sets have_openblas to 1 when the library is there.
if [[ ! -e $OPENBLAS_DIR/libblas.so.3 && $FETCH_OPENBLAS == 1 ]]; then
  mkdir -p "$CACHE/openblas"
  (cd "$CACHE/openblas" && apt-get download libopenblas0-openmp >/dev/null 2>&1 &&
    dpkg -x libopenblas0-openmp_*.deb root &&
    ln -sfn "$PWD/root/usr/lib/x86_64-linux-gnu/openblas-openmp" lib) ||
    echo "note: could not fetch OpenBLAS; eager+openblas rows skipped"
fi
have_openblas=0
[[ -e $OPENBLAS_DIR/libblas.so.3 ]] && have_openblas=1
