/* A program outside the tree: finds Chorus through find_package or pkg-config and runs a one-rank all-reduce. */
#include <chorus/chorus.h>
#include <stdio.h>

int main(void) {
  chorusUniqueId id;
  chorusComm_t comm;
  float v[4] = {1, 2, 3, 4};
  if (chorusGetUniqueId(&id) != chorusSuccess || chorusCommInitRank(&comm, 1, id, 0) != chorusSuccess) {
    fprintf(stderr, "init failed: %s\n", chorusGetLastError(NULL));
    return 1;
  }
  if (chorusAllReduce(v, v, 4, chorusFloat32, chorusSum, comm, NULL) != chorusSuccess || v[3] != 4.0f) {
    fprintf(stderr, "all-reduce failed: %s\n", chorusGetLastError(comm));
    return 1;
  }
  chorusCommDestroy(comm);
  printf("consumer: ok\n");
  return 0;
}
