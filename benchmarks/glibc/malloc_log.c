/* LD_PRELOAD shim that logs malloc/calloc/realloc/posix_memalign/free (op, address, size, thread) as
   40-byte records to $MLOG while mlog_enable(1) is in effect. c10's CPU allocator calls posix_memalign
   with alignment 64, so its records are the tensor storage; the rest is the C++/Python runtime. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>
#include <fcntl.h>
#include <string.h>
static void *(*real_malloc)(size_t); static void (*real_free)(void*); static void *(*real_calloc)(size_t,size_t);
static void *(*real_realloc)(void*,size_t); static int (*real_pm)(void**,size_t,size_t);
static int fd=-1; static __thread int in_hook=0; static int enabled=0;
struct rec { char op; uint64_t a; uint64_t b; uint64_t n; uint64_t tid; };
static void logit(char op, void* a, void* b, size_t n){ if(fd<0||!enabled||in_hook) return; in_hook=1; struct rec r={op,(uint64_t)a,(uint64_t)b,n,(uint64_t)gettid()}; write(fd,&r,sizeof r); in_hook=0; }
void mlog_enable(int on){ if(fd<0){ fd=open(getenv("MLOG"),O_WRONLY|O_CREAT|O_TRUNC,0644);} enabled=on; }
static void init(){ real_malloc=dlsym(RTLD_NEXT,"malloc"); real_free=dlsym(RTLD_NEXT,"free"); real_calloc=dlsym(RTLD_NEXT,"calloc"); real_realloc=dlsym(RTLD_NEXT,"realloc"); real_pm=dlsym(RTLD_NEXT,"posix_memalign"); }
static char buf[65536]; static size_t bufpos=0;
void* malloc(size_t n){ if(!real_malloc){ if(bufpos+n>sizeof buf) return NULL; void*p=buf+bufpos; bufpos+=(n+15)&~15; return p;} void*p=real_malloc(n); logit('m',p,0,n); return p; }
void free(void*p){ if((char*)p>=buf && (char*)p<buf+sizeof buf) return; if(!real_free) init(); logit('f',p,0,0); real_free(p); }
void* calloc(size_t a,size_t b){ if(!real_calloc){ void*p=malloc(a*b); if(p) memset(p,0,a*b); return p;} void*p=real_calloc(a,b); logit('m',p,0,a*b); return p; }
void* realloc(void*p,size_t n){ if(!real_realloc) init(); void*q=real_realloc(p,n); logit('r',q,p,n); return q; }
int posix_memalign(void**pp,size_t al,size_t n){ if(!real_pm) init(); int r=real_pm(pp,al,n); if(!r) logit('a',*pp,(void*)al,n); return r; }
__attribute__((constructor)) static void ctor(){ init(); }
